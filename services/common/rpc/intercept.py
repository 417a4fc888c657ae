"""`HandlerInterceptor`: the step every server interceptor here shares. It finds the RPC's handler,
passes None (a method no service serves) through, and lets the subclass answer with the handler as
found or a wrapped one (`wrap`: the token check in auth.py, the decode checks in decode.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


class HandlerInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self.wrap(handler, handler_call_details)

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """The handler the call runs: `handler` itself or one wrapped around it."""
        raise NotImplementedError
