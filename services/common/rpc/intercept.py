"""The steps the interceptors here share. Server side, `HandlerInterceptor`: it finds the RPC's handler,
passes None (a method no service serves) through, and lets the subclass answer with the handler as
found or a wrapped one (`wrap`: the token check in auth.py, the decode checks in decode.py). Client
side, `metadata_interceptors`: one interceptor per call kind (grpc wants four) adding headers to every
call (the bearer token in auth.py, the trace context in trace_context.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


Headers = Callable[[], Iterable[tuple[str, str]]]


def with_metadata(
    details: grpc.aio.ClientCallDetails, headers: Iterable[tuple[str, str]]
) -> grpc.aio.ClientCallDetails:
    """`details` with `headers` added to its metadata."""
    return grpc.aio.ClientCallDetails(
        method=details.method,
        timeout=details.timeout,
        metadata=grpc.aio.Metadata(*(details.metadata or ()), *headers),
        credentials=details.credentials,
        wait_for_ready=details.wait_for_ready,
    )


class _AddsMetadata:
    def __init__(self, headers: Headers):
        self.headers = headers

    def details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return with_metadata(details, self.headers())


class MetadataUnaryUnary(_AddsMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[override]
        return await continuation(self.details(client_call_details), request)


class MetadataUnaryStream(_AddsMetadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[override]
        return await continuation(self.details(client_call_details), request)


class MetadataStreamUnary(_AddsMetadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[override]
        return await continuation(self.details(client_call_details), request_iterator)


class MetadataStreamStream(_AddsMetadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[override]
        return await continuation(self.details(client_call_details), request_iterator)


def metadata_interceptors(
    headers: Headers, unary_unary: type[MetadataUnaryUnary] = MetadataUnaryUnary
) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors adding `headers()` to every call; `unary_unary` may do more for that kind."""
    return [
        unary_unary(headers),
        MetadataUnaryStream(headers),
        MetadataStreamUnary(headers),
        MetadataStreamStream(headers),
    ]
