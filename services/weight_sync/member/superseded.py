"""Join a broadcast-group instance while watching the synchronizer: give up once it is superseded.

A member joins generation G of the group when the synchronizer tells it to (a broadcast is about to
start). If G can no longer complete - its host (the trainer, rank 0) was killed before hosting it,
or a member died before arriving - the synchronizer moves to G + 1 (the trainer registers again, a
member is reported or marked lost). A join blocked on G would otherwise wait for the group's whole
timeout (`synchronizer.sync_timeout`, an hour by default) and hold the run up with it.

`join_unless_superseded(client, info, join)` runs `join(abandon)` (which does the blocking join in a
worker thread and checks the `threading.Event` between short waits, `group.Connection.open`) and,
while it runs, heartbeats the synchronizer every `poll_s`; when the announced generation is no
longer `info.generation` it sets `abandon`, and the join raises `StaleGenerationError`.

A joined member blocked in a broadcast has the same problem once the broadcast can no longer
complete: its sender (the trainer) was killed and restarted, or a member is gone. A receiver may not
even learn of it from the network (a connection whose close never arrived, a peer that stalled), so
`broadcast_unless_called_off(client, generation, transfer, abandon)` heartbeats while the transfer
(a receive, or the trainer's send: a receiver that stalled leaves it waiting too) runs and calls
`abandon()` once the synchronizer has said twice in a row that no broadcast of `generation` is in
progress (`broadcast_generation`: it calls a broadcast off when its sender or a member leaves, is
lost, registers again or fails to receive it); twice, so that the end of a broadcast that is just
finishing is not taken for its loss. The transfer then raises `StaleGenerationError`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from services.weight_sync.errors import StaleGenerationError
from services.weight_sync.wire.group import GroupInfo

POLL_S = 1.0


class GenerationSource(Protocol):
    """What the watch needs of `services.weight_sync.member.client.SyncClient`."""

    generation: int
    broadcast_generation: int

    async def heartbeat(self) -> Any: ...


def check_generation(info: GroupInfo, told: int, who: str) -> None:
    """Refuse to join an instance other than the one the broadcast was announced in: the group
    changed in between, and nobody else will join this one for that broadcast."""
    if told and info.generation != told:
        raise StaleGenerationError(
            f"{who} was told to join generation {told} of the weight-sync group, and the synchronizer "
            f"now hands out generation {info.generation}: the group changed; ask again"
        )


async def join_unless_superseded(
    client: GenerationSource,
    info: GroupInfo,
    join: Callable[[threading.Event], Awaitable[Any]],
    poll_s: float = POLL_S,
) -> Any:
    abandon = threading.Event()

    def superseded() -> bool:
        return client.generation != info.generation

    return await _watched(client, join(abandon), superseded, abandon.set, poll_s, times=1)


async def broadcast_unless_called_off(
    client: GenerationSource,
    generation: int,
    transfer: Awaitable[Any],
    abandon: Callable[[], None],
    poll_s: float = POLL_S,
) -> Any:
    """Await `transfer` (a broadcast of `generation`, sent or received); call `abandon()` when the
    synchronizer no longer has that broadcast in progress (see the module docstring)."""

    def called_off() -> bool:
        return client.broadcast_generation != generation

    return await _watched(client, transfer, called_off, abandon, poll_s, times=2)


async def _watched(
    client: GenerationSource,
    work: Awaitable[Any],
    gone: Callable[[], bool],
    abandon: Callable[[], None],
    poll_s: float,
    times: int,
) -> Any:
    """Await `work`, heartbeating every `poll_s` while it runs; `abandon()` once `gone()` held after
    `times` heartbeats in a row, or when the wait is cancelled (the work gives up at its next look)."""
    task = asyncio.ensure_future(work)
    seen = 0
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            try:
                await client.heartbeat()
            except Exception:  # noqa: BLE001 - the synchronizer is away: the group's own timeout bounds it
                seen = 0
                continue
            seen = seen + 1 if gone() else 0
            if seen == times:
                abandon()
    finally:
        if not task.done():
            abandon()
            await asyncio.gather(task, return_exceptions=True)
