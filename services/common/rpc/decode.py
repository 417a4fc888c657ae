"""Undecodable request bytes, and requests over a bound, become INVALID_ARGUMENT, for every RPC of every service.

Left alone, grpc answers a request deserializer that raises (a `DecodeError` from protobuf, or any
error from a custom parser such as the buffer's `WireBatch.parse`) with UNKNOWN "Unexpected
DecodeError". This interceptor wraps each handler's deserializer so that a failure yields an
`Undecodable` marker instead, and wraps the behavior so that meeting the marker (the request of a
unary call, or any message of a request stream) aborts with INVALID_ARGUMENT
"request: cannot decode <message type>". Handlers without a deserializer (raw bytes) are left as they
are; so is a behavior that is neither a coroutine nor an async generator function.

A decoded `rft.v1` request message is then checked against the bounds of its strings and lists
(`bounds.message_problem`): one over a bound becomes an `OverBound` marker, answered with
INVALID_ARGUMENT "<field path>: <why>" (e.g. `lease_id: 'LLLL...' (10000 characters) is ...`) before the
servicer sees it. Requests a custom parser returns as something other than a message (the buffer's
`WireBatch`, raw weight chunks) are bounded by the message size limit and by their servicer.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.message import Message

from services.common.rpc.bounds import message_problem
from services.common.rpc.intercept import HandlerInterceptor

MAX_REASON_CHARS = 200


class Undecodable:
    """What a wrapped deserializer returns for bytes it cannot decode."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


class OverBound:
    """What a wrapped deserializer returns for a request with a string or list over its bound."""

    __slots__ = ("field", "why")

    def __init__(self, field: str, why: str):
        self.field = field
        self.why = why


def request_type_name(method: str, deserializer: Callable[[bytes], Any]) -> str:
    """`rft.v1.ExperienceBatch` for `/rft.v1.BufferService/Put`: the input type of the method's descriptor,
    else the message class the deserializer belongs to, else a generic phrase."""
    service, _, name = method.lstrip("/").rpartition("/")
    try:
        return (
            descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name).input_type.full_name
        )
    except (KeyError, AttributeError):
        pass
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "the request message")


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            request = deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any parser failure is the client's bad bytes
            return Undecodable(f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS])
        if isinstance(request, Message) and request.DESCRIPTOR.full_name.startswith("rft."):
            problem = message_problem(request)
            if problem is not None:
                return OverBound(*problem)
        return request

    return deserialize


async def _refuse(
    context: grpc.aio.ServicerContext, type_name: str, bad: Undecodable | OverBound, where: str = ""
) -> None:
    if isinstance(bad, OverBound):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{bad.field}: {bad.why}{where}")
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, f"request: cannot decode {type_name}{where}: {bad.reason}"
    )


def _checked_stream(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, type_name: str
) -> AsyncIterator[Any]:
    async def iterate() -> AsyncIterator[Any]:
        index = 0
        async for request in requests:
            if isinstance(request, (Undecodable, OverBound)):
                await _refuse(context, type_name, request, f" (stream message {index})")
            yield request
            index += 1

    return iterate()


def _checked_behavior(
    behavior: Callable[..., Any], streaming: bool, type_name: str
) -> Callable[..., Any] | None:
    """The behavior with its request (or request stream) checked first; None if its kind is unknown."""

    async def check(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if streaming:
            return _checked_stream(request, context, type_name)
        if isinstance(request, (Undecodable, OverBound)):
            await _refuse(context, type_name, request)
        return request

    if inspect.iscoroutinefunction(behavior):

        async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await behavior(await check(request, context), context)

        return coroutine
    if inspect.isasyncgenfunction(behavior):

        async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for response in behavior(await check(request, context), context):
                yield response

        return generator
    return None


_KINDS = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


def checked_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """`handler` with its request deserializer made safe (see the module docstring)."""
    if handler.request_deserializer is None:
        return handler
    attr, make = _KINDS[(bool(handler.request_streaming), bool(handler.response_streaming))]
    type_name = request_type_name(method, handler.request_deserializer)
    behavior = _checked_behavior(getattr(handler, attr), bool(handler.request_streaming), type_name)
    if behavior is None:
        return handler
    return make(
        behavior,
        request_deserializer=_safe(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


class DecodeErrorInterceptor(HandlerInterceptor):
    """Answers undecodable request bytes with INVALID_ARGUMENT naming the request type, and a request over
    a bound with INVALID_ARGUMENT naming the field."""

    def __init__(self) -> None:
        # method -> (the handler as found, its checked version): handlers are the same objects call after call
        self._cache: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        cached = self._cache.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._cache[method] = (handler, checked_handler(handler, method))
        return cached[1]
