"""The one gRPC error mapper (`services/common/rpc/errors.py`): rule order, field prefixes, re-raise,
and every servicer's table pinned to the status codes it returned before the mapper was shared."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError as RedisResponseError

from services.buffer.records import BufferFull, ConsumerNotOpen, FencedError, LeaseError, ValidationError
from services.buffer.servicer import ERRORS as BUFFER
from services.common.rpc.errors import ErrorMap, Rule
from services.explorer.serve.sessions import SessionError
from services.explorer.servicer import ERRORS as EXPLORER
from services.explorer.servicer import SERVE_ERRORS
from services.explorer.tasksets import TasksetError
from services.synchronizer.errors import InvalidArgument, NotRegistered, WrongState
from services.synchronizer.servicer import ERRORS as SYNCHRONIZER
from services.trainer.core import InvalidRequest, NoBatchError, PreconditionError
from services.trainer.servicer import ERRORS as TRAINER
from services.weight_sync.errors import (
    GroupBrokenError,
    MissingChunkError,
    StaleGenerationError,
    WeightSyncError,
)
from services.weight_sync.tree.notices import NoticeUnavailable
from services.weight_sync.tree.server import ERRORS as RELAY
from services.weight_sync.tree.server import DeltaBaseMismatch, NoticesOff, StepNotAnswered
from services.weight_sync.tree.store import RelayBroken, VersionNotHeld

C = grpc.StatusCode


def _code(table: ErrorMap, exc: BaseException, prefix: str = "") -> C | None:
    status = table.status_of(exc, prefix)
    return None if status is None else status[0]


class _Aborted(Exception):
    pass


class _Context:
    """The part of `grpc.aio.ServicerContext` a guard uses: `abort` raises, as the real one does."""

    def __init__(self):
        self.aborted: tuple[C, str] | None = None

    async def abort(self, code: C, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted(details)


def test_first_matching_rule_decides_and_names_the_field():
    table = ErrorMap(
        Rule(KeyError, C.NOT_FOUND),
        Rule(LookupError, C.OUT_OF_RANGE),
        Rule(ValueError, C.INVALID_ARGUMENT, names_field=True),
    )
    assert table.status_of(KeyError("k")) == (C.NOT_FOUND, "'k'")
    assert table.status_of(IndexError("i")) == (C.OUT_OF_RANGE, "i")
    assert table.status_of(ValueError("tokens: empty"), "batches[2].") == (
        C.INVALID_ARGUMENT,
        "batches[2].tokens: empty",
    )
    assert table.status_of(RuntimeError("not ours")) is None


def test_a_rule_may_decline_and_a_code_may_depend_on_the_error():
    table = ErrorMap(
        Rule(OSError, C.UNAVAILABLE, lambda e: None if "keep" in str(e) else f"away: {e}"),
        Rule(ValueError, lambda e: C.NOT_FOUND if "404" in str(e) else C.INVALID_ARGUMENT),
    )
    assert table.status_of(OSError("disk")) == (C.UNAVAILABLE, "away: disk")
    assert table.status_of(OSError("keep me")) is None  # declined: raised as it is
    assert _code(table, ValueError("404")) == C.NOT_FOUND
    assert _code(table, ValueError("bad")) == C.INVALID_ARGUMENT


def test_guard_aborts_with_the_mapped_status_and_lets_the_rest_through():
    table = ErrorMap(Rule(ValueError, C.INVALID_ARGUMENT, names_field=True))

    async def run(exc: BaseException | None):
        context = _Context()

        async def call():
            if exc is not None:
                raise exc
            return "ok"

        try:
            return await table.guard(context, call, prefix="request."), context
        except _Aborted:
            return "aborted", context

    assert asyncio.run(run(None))[0] == "ok"
    outcome, context = asyncio.run(run(ValueError("n must be > 0")))
    assert outcome == "aborted" and context.aborted == (C.INVALID_ARGUMENT, "request.n must be > 0")
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(run(RuntimeError("boom")))


def test_guard_stream_aborts_before_or_between_items_and_lets_the_rest_through():
    table = ErrorMap(Rule(LookupError, C.NOT_FOUND))

    async def run(fail_after: int, exc: BaseException):
        context, got = _Context(), []

        async def items():
            for i in range(3):
                if i == fail_after:
                    raise exc
                yield i

        try:
            async for item in table.guard_stream(context, items()):
                got.append(item)
        except _Aborted:
            pass
        return got, context.aborted

    assert asyncio.run(run(0, KeyError("v"))) == ([], (C.NOT_FOUND, "'v'"))
    assert asyncio.run(run(2, LookupError("gone"))) == ([0, 1], (C.NOT_FOUND, "gone"))
    assert asyncio.run(run(5, KeyError("never"))) == ([0, 1, 2], None)
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(run(1, RuntimeError("boom")))


def test_relay_table():
    """The codes and messages the relay's hand-written aborts gave (tree/server.py)."""
    assert _code(RELAY, NoticesOff("off")) == C.UNIMPLEMENTED
    assert RELAY.status_of(StepNotAnswered("step: min_version only")) == (
        C.INVALID_ARGUMENT,
        "step: min_version only",
    )
    assert _code(RELAY, VersionNotHeld("v3")) == _code(RELAY, DeltaBaseMismatch("base")) == C.NOT_FOUND
    assert RELAY.status_of(NoticeUnavailable("x")) == (C.UNAVAILABLE, "no source answered the relay: x")
    assert RELAY.status_of(RelayBroken("y" * 2000))[1] == ("relay lost the version: " + "y" * 2000)[:1000]
    assert _code(RELAY, WeightSyncError("other")) is None


def test_synchronizer_table():
    assert _code(SYNCHRONIZER, NotRegistered("m")) == C.NOT_FOUND
    assert _code(SYNCHRONIZER, WrongState("w")) == C.FAILED_PRECONDITION
    for exc in (InvalidArgument("member.role"), MissingChunkError("c"), ValueError("v")):
        assert _code(SYNCHRONIZER, exc) == C.INVALID_ARGUMENT, exc
    assert _code(SYNCHRONIZER, RuntimeError("r")) is None


def test_explorer_tables():
    for exc in (KeyError("k"), ValueError("v"), MissingChunkError("c")):
        assert _code(EXPLORER, exc) == C.INVALID_ARGUMENT, exc
    for exc in (StaleGenerationError("s"), TasksetError("t")):
        assert _code(EXPLORER, exc) == C.FAILED_PRECONDITION, exc
    for exc in (GroupBrokenError("g"), WeightSyncError("w")):
        assert _code(EXPLORER, exc) == C.UNAVAILABLE, exc
    assert SERVE_ERRORS.status_of(SessionError("gone", status=404, param="session_id")) == (
        C.NOT_FOUND,
        "session_id: gone",
    )
    assert _code(SERVE_ERRORS, SessionError("busy", status=409)) == C.FAILED_PRECONDITION
    assert _code(SERVE_ERRORS, SessionError("bad")) == C.INVALID_ARGUMENT
    assert _code(SERVE_ERRORS, ValueError("not a session error")) is None


def test_buffer_table():
    assert BUFFER.status_of(ValidationError("experiences[3].logprobs", "not finite"), "batches[1].") == (
        C.INVALID_ARGUMENT,
        "batches[1].experiences[3].logprobs: not finite",
    )
    assert _code(BUFFER, BufferFull("full")) == C.RESOURCE_EXHAUSTED
    assert _code(BUFFER, LeaseError("l")) == C.FAILED_PRECONDITION
    assert _code(BUFFER, FencedError("f")) == C.ABORTED
    assert _code(BUFFER, ConsumerNotOpen("c")) == C.NOT_FOUND
    assert BUFFER.status_of(RedisConnectionError("refused")) == (
        C.UNAVAILABLE,
        "buffer store unavailable: refused",
    )
    assert _code(BUFFER, OSError("o")) == C.UNAVAILABLE
    code, message = BUFFER.status_of(RedisResponseError("MISCONF cannot persist"))
    assert code == C.UNAVAILABLE and "Redis refuses writes" in message
    assert BUFFER.status_of(RedisResponseError("WRONGTYPE")) is None  # raised as it is


def test_trainer_table():
    assert TRAINER.status_of(InvalidRequest("method", "unknown")) == (C.INVALID_ARGUMENT, "method: unknown")
    assert _code(TRAINER, PreconditionError("p")) == C.FAILED_PRECONDITION
    assert _code(TRAINER, NoBatchError("n")) == C.DEADLINE_EXCEEDED
    assert _code(TRAINER, RuntimeError("r")) is None
