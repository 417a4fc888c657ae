"""One path for "the synchronizer is away: back off, or register again".

A synchronizer restarts (its members see UNAVAILABLE while it is down, DEADLINE_EXCEEDED while it is
slow) and a restarted one has forgotten its members (NOT_FOUND until each registers again). Every
member that talks to it in a loop (the explorer's sync gate, the follow loop of serve mode and of the
in-flight follower (follow.py), the explorer's wait for a trainer, the trainer's sync hook, the
heartbeat loop) handles such an error the same way: `synchronizer_away(exc, register)` returns when the synchronizer is away (having
registered again when it forgot this member) and raises anything else; `Backoff`
(services/common/backoff.py) spaces the retries (50 ms doubling to 1 s, reset after a success).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.common.backoff import Backoff
from services.common.log import get_logger

__all__ = ["AWAY_CODES", "Backoff", "is_away", "synchronizer_away"]

log = get_logger("sync")

# restarting (UNAVAILABLE), slow (DEADLINE_EXCEEDED), restarted and forgot this member (NOT_FOUND)
AWAY_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.NOT_FOUND}
)


def is_away(exc: BaseException) -> bool:
    """Whether `exc` is a call to the synchronizer that failed because it is away."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in AWAY_CODES


async def synchronizer_away(
    exc: grpc.aio.AioRpcError, register: Callable[[], Awaitable[Any]] | None = None
) -> None:
    """Return if `exc` says the synchronizer is away, else raise `exc`. When it forgot this member
    (NOT_FOUND) and `register` is given, register again first; a registration that fails as well is
    retried on the caller's next call (its next call fails NOT_FOUND again)."""
    if exc.code() not in AWAY_CODES:
        raise exc
    if exc.code() == grpc.StatusCode.NOT_FOUND and register is not None:
        try:
            await register()
        except grpc.aio.AioRpcError as again:
            log.debug("registering again failed", code=again.code().name)
