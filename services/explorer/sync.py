"""The hook between explore steps and weight sync: "before explore step N, wait until allowed (and
fetch new weights if needed)". The synchronizer's client plugs in here; the default never waits.

`VersionGate` implements the plan locally: with `sync_interval` I and `sync_offset` K, explore step N
(1-based) needs weights of version >= ((N - 1 - K) // I) * I, i.e. the explorer runs at most K steps
ahead of the weights it holds (K = 0: strictly on-policy). It waits on a condition that
`notify_version` (called after every weight load) wakes, up to `timeout_s`; `blocked` is set while a
step waits (`waiting_for` names the version). (The synchronizer's `trainer_driven` and `fully_async`
styles never wait; `NeverWait` is their local counterpart.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class SyncGate(Protocol):
    async def before_step(self, step: int, model_version: int) -> None:
        """Return when step `step` may run; raise to stop exploring."""
        ...

    def notify_version(self, model_version: int) -> None: ...

    def step_metrics(self) -> dict[str, float]:
        """Seconds the last `before_step` spent blocked on the plan (`time/wait_for_weights`) and
        fetching + loading new weights (`time/load_weights`)."""
        ...


class NeverWait:
    async def before_step(self, step: int, model_version: int) -> None:
        return None

    def step_metrics(self) -> dict[str, float]:
        return {"time/wait_for_weights": 0.0, "time/load_weights": 0.0}

    def notify_version(self, model_version: int) -> None:
        return None


class SyncTimeout(TimeoutError):
    pass


class VersionGate:
    def __init__(self, sync_interval: int = 1, sync_offset: int = 0, timeout_s: float = 3600.0):
        self.sync_interval = sync_interval
        self.sync_offset = sync_offset
        self.timeout_s = timeout_s
        self._version = 0
        self._changed = asyncio.Condition()
        self.waiting_for: int | None = None
        self.blocked = asyncio.Event()  # set while a step waits for weights
        self._wakers: set[asyncio.Task[None]] = set()
        self._waited = 0.0

    def required_version(self, step: int) -> int:
        return max(step - 1 - self.sync_offset, 0) // self.sync_interval * self.sync_interval

    async def before_step(self, step: int, model_version: int) -> None:
        self._version = max(self._version, model_version)
        need = self.required_version(step)
        self._waited = 0.0
        if self._version >= need:
            return
        self.waiting_for = need
        self.blocked.set()
        t0 = time.perf_counter()
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(lambda: self._version >= need), self.timeout_s)
        except TimeoutError:
            raise SyncTimeout(
                f"explore step {step} needs model version >= {need}, still at {self._version} after {self.timeout_s:g}s"
            ) from None
        finally:
            self.waiting_for = None
            self.blocked.clear()
            self._waited = time.perf_counter() - t0

    def step_metrics(self) -> dict[str, float]:
        return {"time/wait_for_weights": self._waited, "time/load_weights": 0.0}

    def notify_version(self, model_version: int) -> None:
        self._version = max(self._version, model_version)

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: nobody can be waiting
            return

        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        task = loop.create_task(wake())
        self._wakers.add(task)
        task.add_done_callback(self._wakers.discard)
