"""One gRPC error mapper for every servicer: the project's error types -> status codes.

A servicer is a thin adapter (docs/conventions.md): it calls its core, and a domain error the core raises
becomes one status code with a readable message (docs/conventions.md: INVALID_ARGUMENT names the field,
FAILED_PRECONDITION a wrong state, UNAVAILABLE retry, ...). Each service declares its table once,

    ERRORS = ErrorMap(
        Rule(ValidationError, grpc.StatusCode.INVALID_ARGUMENT, names_field=True),
        Rule(LeaseError, grpc.StatusCode.FAILED_PRECONDITION),
    )
    reply = await ERRORS.guard(context, lambda: core.put(batch), prefix=f"batches[{i}].")

and every RPC goes through `guard` (a streaming RPC through `guard_stream`, which maps an error raised
before or between the items it yields). Rules are tried in order, as `except` clauses are: the first whose
types match decides; its `message(exc)` returning None means "not ours after all" and the error is
raised as it is (no later rule is tried). `names_field`: the caller's `prefix` (the path of the
request part the call was about, e.g. `batches[3].`) goes before the message, which names the field
inside it. `status_of` is the pure mapping (tests pin each table with it).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

__all__ = ["ErrorMap", "Rule"]

T = TypeVar("T")


@dataclass(frozen=True)
class Rule:
    """Errors of these `types` abort the call with `code` (or `code(exc)`, for an error that carries
    its kind, e.g. an HTTP-like status) and `message(exc)` (None: re-raise)."""

    types: type[BaseException] | tuple[type[BaseException], ...]
    code: grpc.StatusCode | Callable[[BaseException], grpc.StatusCode]
    message: Callable[[BaseException], str | None] = str
    names_field: bool = False

    def code_of(self, exc: BaseException) -> grpc.StatusCode:
        return self.code if isinstance(self.code, grpc.StatusCode) else self.code(exc)


class ErrorMap:
    """An ordered table of `Rule`s (module docstring)."""

    def __init__(self, *rules: Rule):
        self.rules = rules

    def status_of(self, exc: BaseException, prefix: str = "") -> tuple[grpc.StatusCode, str] | None:
        """The (code, message) `exc` maps to, or None when no rule takes it."""
        for rule in self.rules:
            if isinstance(exc, rule.types):
                message = rule.message(exc)
                if message is None:
                    return None
                return rule.code_of(exc), (prefix + message if rule.names_field else message)
        return None

    async def guard(
        self, context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]], prefix: str = ""
    ) -> T:
        """`await call()`; a mapped error aborts the RPC with its status, any other propagates."""
        try:
            return await call()
        except Exception as exc:
            status = self.status_of(exc, prefix)
            if status is None:
                raise
            await context.abort(*status)
        raise AssertionError("unreachable")  # context.abort raises

    async def guard_stream(
        self, context: grpc.aio.ServicerContext, items: AsyncGenerator[T, None], prefix: str = ""
    ) -> AsyncGenerator[T, None]:
        """Yield `items`; a mapped error (before the first item or between two) aborts the RPC with
        its status, any other propagates. `items` is closed when this stream is (a cancelled call)."""
        try:
            async with contextlib.aclosing(items):
                async for item in items:
                    yield item
        except Exception as exc:
            status = self.status_of(exc, prefix)
            if status is None:
                raise
            await context.abort(*status)
