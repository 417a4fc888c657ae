"""One loop that follows the synchronizer: load each version the trainer publishes until the run ends.

`follow_versions` asks `wait_for_version(min_version=held() + step)`, skips an answer that timed out
or that the method does not want (`SyncMethod.wants`), fetches the rest, reports each load
(`report_load`; a broken or stale broadcast group is reported as failed: the next generation sends
again) and returns when the answer says the run `finished`. A failed wait backs off (`Backoff`).

Two explorers' tasks run it, with what differs as parameters:
- the in-flight follower (services/explorer/inflight.py): `held` is the explorer's version, `step`
  its `sync_interval`, no `on_away` (the sync gate re-registers), `errors="report"`: any failed load is
  logged and reported and a failed report is only logged; the loop goes on;
- serve mode (services/explorer/serve/endpoint.py): its own count of the version held, `step` 1,
  `on_away=synchronizer_away(..., register)` (away: back off, forgotten: register again, else raise),
  `errors="raise"`: a fetch cut off by a synchronizer that is away is asked again, anything else ends
  the loop (and the serve task with it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import grpc

from services.common.log import get_logger
from services.weight_sync.errors import GroupBrokenError, StaleGenerationError
from services.weight_sync.member.away import Backoff, is_away
from services.weight_sync.method import Fetch, SyncMethod, WaitAnswer

__all__ = ["FollowClient", "follow_versions"]

_log = get_logger("sync.follow")


class FollowClient(Protocol):
    """What the loop needs of `services.weight_sync.member.client.SyncClient`."""

    async def wait_for_version(
        self, step: int = 0, min_version: int = 0, timeout_s: float | None = None
    ) -> WaitAnswer: ...

    async def report_load(
        self, version: int, ok: bool, generation: int = 0, message: str = "", within_s: float | None = None
    ) -> None: ...


async def follow_versions(
    client: FollowClient,
    fetch: Fetch,
    method: SyncMethod,
    held: Callable[[], int],
    *,
    timeout_s: float,
    step: int = 1,
    on_away: Callable[[grpc.aio.AioRpcError], Awaitable[None]] | None = None,
    errors: Literal["report", "raise"] = "raise",
    on_loaded: Callable[[int], None] | None = None,
    log: Any = None,
) -> None:
    """Fetch, load and report every version after `held()` (in `step`s) until the run finishes.

    `timeout_s`: one wait's window. `on_away(exc)`: awaited when a wait fails, before backing off
    (it may raise); None: only back off. `errors`: "report" logs and reports a load failed for any
    reason and logs a failed report, and goes on; "raise" retries a fetch the synchronizer cut off by
    being away and raises anything else. `on_loaded(version)`: after each successful fetch, before its
    report. `log`: the caller's logger."""
    log = log if log is not None else _log
    backoff = Backoff()
    while True:
        try:
            answer = await client.wait_for_version(min_version=held() + step, timeout_s=timeout_s)
        except grpc.aio.AioRpcError as exc:
            log.debug("wait for a version failed", code=exc.code().name)
            if on_away is not None:
                await on_away(exc)
            await backoff.wait()
            continue
        backoff.reset()
        if answer.finished:
            return
        if answer.timed_out or not method.wants(answer, held()):
            continue
        try:
            await _load(client, fetch, answer, backoff, errors, on_loaded, log)
        except grpc.aio.AioRpcError as exc:
            if errors == "raise":
                raise
            log.warning("load report failed", code=exc.code().name)  # the gate's next ask tells


async def _load(
    client: FollowClient,
    fetch: Fetch,
    answer: WaitAnswer,
    backoff: Backoff,
    errors: str,
    on_loaded: Callable[[int], None] | None,
    log: Any,
) -> None:
    """Fetch one offered version and report the outcome (`follow_versions` says what fails how)."""
    offered = int(answer.model_version.version)
    try:
        loaded = await fetch(answer)
    except (GroupBrokenError, StaleGenerationError) as exc:  # the group changed: the next one sends again
        await client.report_load(offered, False, answer.generation, f"{type(exc).__name__}: {exc}")
        return
    except Exception as exc:
        if errors == "report":
            error = f"{type(exc).__name__}: {exc}"
            log.warning("weight load failed", version=offered, error=error)
            await client.report_load(offered, False, answer.generation, error)
            return
        if not is_away(exc):
            raise
        await backoff.wait()  # the synchronizer went away or moved on mid-pull: ask again
        return
    if on_loaded is not None:
        on_loaded(loaded)
    await client.report_load(loaded, True, answer.generation)
    log.info("new weights loaded", version=loaded)
