"""Trace context over gRPC metadata (W3C `traceparent`), installed only while tracing is on
(services/common/tracing.py): client interceptors inject the caller's context (a unary call gets a
CLIENT span of its own), and `TraceServerInterceptor` runs each call under a SERVER span, child of the
caller's context. Written here rather than pulling opentelemetry-instrumentation-grpc: a few lines on
top of the API's `propagate`, and no wrapping of grpc's own classes."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

from services.common import tracing
from services.common.rpc.intercept import HandlerInterceptor, MetadataUnaryUnary, metadata_interceptors


def _context_headers() -> Iterable[tuple[str, str]]:
    """The current trace context as metadata (`traceparent`, and `tracestate` when there is one)."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.items()


def _method(details: Any) -> str:
    method = details.method
    return (method.decode() if isinstance(method, bytes) else method).lstrip("/")


class TraceUnaryUnary(MetadataUnaryUnary):
    """Carries the context, under a CLIENT span of the call's own (a stream carries the caller's)."""

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[override]
        t = tracing.tracer()
        if t is None:
            return await continuation(client_call_details, request)
        from opentelemetry.trace import SpanKind

        with t.start_as_current_span(_method(client_call_details), kind=SpanKind.CLIENT):
            call = await super().intercept_unary_unary(continuation, client_call_details, request)
            return await call


def client_trace_interceptors() -> list[Any]:
    """The interceptors a channel gets while tracing is on; none when off."""
    if not tracing.enabled():
        return []
    return metadata_interceptors(_context_headers, unary_unary=TraceUnaryUnary)


_KINDS = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


class TraceServerInterceptor(HandlerInterceptor):
    """Each call runs under a SERVER span named for its method, child of the caller's `traceparent`.
    A streaming answer's span is not made current (an async generator may be closed from another
    context), so only unary answers parent the spans of what they call."""

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        t = tracing.tracer()
        if t is None or details.method.startswith("/grpc."):  # health checks and reflection: no spans
            return handler
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        parent = propagate.extract({k: v for k, v in details.invocation_metadata or () if isinstance(v, str)})
        name = _method(details)
        attr, make = _KINDS[(bool(handler.request_streaming), bool(handler.response_streaming))]
        behavior = getattr(handler, attr)

        if inspect.iscoroutinefunction(behavior):

            async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with t.start_as_current_span(name, context=parent, kind=SpanKind.SERVER):
                    return await behavior(request, context)

            wrapped: Any = coroutine
        elif inspect.isasyncgenfunction(behavior):

            async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                span = t.start_span(name, context=parent, kind=SpanKind.SERVER)
                try:
                    async for response in behavior(request, context):
                        yield response
                except BaseException as exc:
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                    raise
                finally:
                    span.end()

            wrapped = generator
        else:
            return handler
        return make(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
