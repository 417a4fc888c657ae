"""The one "synchronizer away: back off or register again" path (`services/weight_sync/member/away.py`)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.weight_sync.member.away import Backoff, is_away, synchronizer_away

C = grpc.StatusCode


def _error(code: C) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


class _Member:
    """Counts registrations; `fail` makes the next one fail as the synchronizer still restarts."""

    def __init__(self, fail: bool = False):
        self.registered, self.fail = 0, fail

    async def register(self) -> None:
        self.registered += 1
        if self.fail:
            raise _error(C.UNAVAILABLE)


@pytest.mark.parametrize("code", [C.UNAVAILABLE, C.DEADLINE_EXCEEDED])
def test_away_returns_without_registering(code):
    member = _Member()
    asyncio.run(synchronizer_away(_error(code), member.register))
    assert member.registered == 0 and is_away(_error(code))


def test_forgotten_member_registers_again_and_a_failed_registration_is_retried_later():
    member = _Member()
    asyncio.run(synchronizer_away(_error(C.NOT_FOUND), member.register))
    assert member.registered == 1
    failing = _Member(fail=True)
    asyncio.run(synchronizer_away(_error(C.NOT_FOUND), failing.register))  # does not raise
    assert failing.registered == 1
    asyncio.run(synchronizer_away(_error(C.NOT_FOUND)))  # nothing to register: just away


@pytest.mark.parametrize("code", [C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.UNAUTHENTICATED, C.INTERNAL])
def test_other_codes_raise(code):
    member = _Member()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(synchronizer_away(_error(code), member.register))
    assert info.value.code() == code and member.registered == 0 and not is_away(info.value)
    assert not is_away(ValueError("not an rpc error"))


def test_backoff_doubles_to_its_cap_and_resets():
    backoff = Backoff(first=0.05, most=0.2)
    delays = []
    for _ in range(4):
        delays.append(backoff.delay)
        asyncio.run(backoff.wait(cap=0))  # a capped wait: no time passes
    assert delays == [0.05, 0.1, 0.2, 0.2]
    backoff.reset()
    assert backoff.delay == 0.05
