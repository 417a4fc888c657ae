"""The sync plan: when the trainer publishes and which weights an explorer needs before a step.

Pure functions of the config (`synchronizer.sync_style`, `sync_interval` I, `sync_offset` K) and a
few counters; the state machine (`core.py`) calls them, tests pin them directly. Versions are in
trainer steps: the weights published after trainer step t are `model_version` t, and explorer step
s (1-based) produces the data of trainer step s (Trinity-RFT's meaning, reference §1).

`fixed` (Trinity: the explorer syncs after step s when s > K and (s - K) % I == 0 and waits for a
version newer than the one it holds; the trainer syncs when its step % I == 0):
    trainer: publish after step t  <=>  t % I == 0
    explorer: before step s it must hold  model_version >= required(s) = (max(s - 1 - K, 0) // I) * I
so it runs at most K steps ahead of the weights it holds. K = 0, I = 1: step s runs on the weights
of trainer step s - 1 (strictly on-policy, like veRL); K = 1: a one-step pipeline (step s runs on
s - 2 at worst). I = 2, K = 0: steps 1-2 on version 0, steps 3-4 on version 2, ...

`explorer_driven` (alias dynamic_by_explorer): an explorer asks for new weights once I steps have
run since its last sync (it then needs any version newer than the one it holds); the trainer
publishes after a step whenever an explorer is REQUIRE_SYNC.

`trainer_driven` (alias dynamic_by_trainer): the trainer publishes once I steps have run since its
last publish; an explorer never blocks on the plan and takes a newer version (or joins a pending
nccl broadcast) at its next step boundary.

`fully_async` (Trinity-RFT 0.6's `fully_async`, veRL's fully_async_policy, AReaL): the trainer
publishes once I steps have run since its last publish, as `trainer_driven`; an explorer never waits
for weights (required version 0 at every step) and takes the newest published version at its next step
boundary, so sampling never stops for training. Staleness is bounded on the consumer side instead: the
trainer leases only experiences with `model_version >= its version - max_staleness` (the buffer drops
older ones), where max_staleness is `algorithm.sample_strategy_args.max_staleness` with
`sample_strategy: staleness_control`, else 4 x I (4 publishes behind, AReaL's documented
`max_head_offpolicyness: 4`; `Resolved.max_staleness`). The trainer logs `sample/staleness/{mean,max}`
(its version minus each trained experience's) and `sample/dropped_stale` per step.
    trainer: publish after step t  <=>  t - last_published >= I
    explorer: required(s) = 0   (sync_offset is not used)

In every style the trainer also publishes when an explorer waits for a version the trainer already
has (a restarted explorer would otherwise wait for the next interval while the trainer waits for its
data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SyncStyle = Literal["fixed", "explorer_driven", "trainer_driven", "fully_async"]
STYLES: tuple[str, ...] = ("fixed", "explorer_driven", "trainer_driven", "fully_async")
# Styles in which an explorer never blocks on the plan (it takes newer weights when there are some).
NEVER_WAITS: tuple[str, ...] = ("trainer_driven", "fully_async")


@dataclass(frozen=True)
class SyncPlan:
    style: SyncStyle = "fixed"
    interval: int = 1
    offset: int = 0

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"sync_style {self.style!r} is not one of {', '.join(STYLES)}")
        if self.interval < 1 or self.offset < 0:
            raise ValueError(
                f"sync_interval must be >= 1 and sync_offset >= 0, got {self.interval}, {self.offset}"
            )

    def explorer_required_version(self, step: int, held: int, last_sync_step: int) -> int:
        """The model_version an explorer must hold before running step `step` (1-based).

        `held`: the version it holds; `last_sync_step`: explorer steps finished when it last synced.
        """
        if step < 1:
            return 0
        if self.style == "fixed":
            return max(step - 1 - self.offset, 0) // self.interval * self.interval
        if self.style == "explorer_driven":
            return held + 1 if (step - 1) - last_sync_step >= self.interval else 0
        return 0  # NEVER_WAITS: the explorer takes what is published, when it is

    def trainer_should_publish(self, step: int, last_published_step: int, explorer_requires: bool) -> bool:
        """Whether the trainer publishes its weights after finishing step `step`.

        `explorer_requires`: some explorer is REQUIRE_SYNC for a version the trainer can give now.
        """
        if explorer_requires:
            return True
        if step <= last_published_step:
            return False
        if self.style == "fixed":
            return step % self.interval == 0
        if self.style in NEVER_WAITS:
            return step - last_published_step >= self.interval
        return False
