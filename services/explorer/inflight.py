"""In-flight weight updates on the explorer side (`explorer.inflight_weight_update`).

Without them an explorer takes new weights only at a step boundary (the sync gate's `before_step`),
so a long generation keeps the old weights to its end. With them:

- every rollout engine is switched to in-flight loads (`enable_inflight`: a load lands between decode
  steps of the running requests, and each token records the version that sampled it);
- `InflightFollower`, a background task beside the steps, runs the member's follow loop
  (`services.weight_sync.member.follow.follow_versions`): it waits on the synchronizer for the next
  version the trainer publishes (`WaitForVersion` with `min_version` = held + `sync_interval`, so it
  never asks for a publish the plan would not make anyway) and fetches and loads it at once, through
  the same fetch as the gate (memory: pull; checkpoint: read; nccl: join the broadcast it is told
  of, so the trainer's broadcast need not wait for this explorer's step boundary), then reports it.
  It leaves re-registering to the gate; a load that fails is reported and it goes on;
- `serialised(fetch, held)` makes the gate and the follower share one fetch: one load at a time, and a
  version already held is not fetched twice.

The sync plan still bounds staleness as before (the gate runs unchanged); the follower only makes the
weights fresher. `inflight_metrics` gives a step's `rollout/inflight_*` figures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from services.common.experience import Experience
from services.common.log import get_logger
from services.weight_sync.member.follow import follow_versions
from services.weight_sync.method import Fetch, SyncMethod, WaitAnswer

log = get_logger("explorer.inflight")


def enable_inflight(engines: Sequence[Any]) -> None:
    """Switch every engine to in-flight weight loads; an engine that cannot is refused by name."""
    for engine in engines:
        switch = getattr(engine, "set_inflight_updates", None)
        if switch is None:
            raise ValueError(
                f"explorer.inflight_weight_update: rollout engine {getattr(engine, 'name', engine)!r} "
                "cannot take weights mid-generation (no set_inflight_updates); use engine_type hf or vllm"
            )
        switch(True)


def serialised(fetch: Fetch, held: Callable[[], int]) -> Fetch:
    """`fetch` one call at a time; an answer offering a version already `held` (and no broadcast to
    join) returns at once."""
    lock = asyncio.Lock()

    async def one(answer: WaitAnswer) -> int:
        async with lock:
            if not answer.receive_broadcast and answer.model_version.version <= held():
                return held()
            return await fetch(answer)

    return one


class InflightFollower:
    """Fetches each newly published version while steps run (module docstring)."""

    def __init__(
        self,
        client: Any,
        fetch: Fetch,
        method: SyncMethod,
        held: Callable[[], int],
        *,
        interval: int = 1,
        timeout_s: float = 600.0,
    ):
        self.client, self.fetch, self.method, self.held = client, fetch, method, held
        self.interval, self.timeout_s = max(1, interval), timeout_s
        self.loads = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start following (again, if it stopped); a no-op while it runs."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._follow(), name="inflight-weights")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _follow(self) -> None:
        def loaded(_version: int) -> None:
            self.loads += 1

        await follow_versions(
            self.client, self.fetch, self.method, self.held,
            timeout_s=self.timeout_s, step=self.interval, errors="report", on_loaded=loaded, log=log,
        )  # fmt: skip


def inflight_metrics(experiences: Sequence[Experience], updates: float) -> dict[str, float]:
    """A step's figures: versions applied mid-generation (`updates`, summed over engines), the share of
    responses whose tokens span more than one version, and the mean number of versions per response."""
    spans = [
        len(set(e.token_model_versions.tolist())) for e in experiences if e.token_model_versions is not None
    ]
    return {
        "rollout/inflight_updates": float(updates),
        "rollout/inflight_mixed_fraction": sum(n > 1 for n in spans) / len(spans) if spans else 0.0,
        "rollout/inflight_versions_mean": sum(spans) / len(spans) if spans else 1.0,
    }
