"""Bearer-token authentication: a server interceptor that answers UNAUTHENTICATED without the token,
and client interceptors that attach it. The health service stays open so orchestrators can probe it.

The token is checked before anything reads the request: a refused call's body is never deserialized,
so garbage from an unauthenticated client gets UNAUTHENTICATED, never a parse error."""

from __future__ import annotations

import hmac
from typing import Any

import grpc

from services.common.rpc.intercept import HandlerInterceptor, metadata_interceptors

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
AUTH_HEADER = "authorization"


def _token_ok(metadata: Any, token: str) -> bool:
    for key, value in metadata or ():
        if key == AUTH_HEADER:
            return hmac.compare_digest(str(value), f"Bearer {token}")
    return False


def _rejecting_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def abort(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def abort_stream(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    # No request deserializer: the body of an unauthenticated call is never parsed (raw bytes, unread).
    kwargs = {"request_deserializer": None, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort_stream, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **kwargs)
    return grpc.unary_unary_rpc_method_handler(abort, **kwargs)


class BearerTokenServerInterceptor(HandlerInterceptor):
    """Refuses every RPC (except health checks) whose `authorization` metadata is not `Bearer <token>`."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("auth token must not be empty")
        self._token = token

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if details.method.startswith(OPEN_PREFIXES) or _token_ok(details.invocation_metadata, self._token):
            return handler
        return _rejecting_handler(handler, "missing or wrong bearer token in 'authorization' metadata")


def client_token_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    header = ((AUTH_HEADER, f"Bearer {token}"),)
    return metadata_interceptors(lambda: header)
