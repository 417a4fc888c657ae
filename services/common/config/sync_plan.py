"""The sync plan: when the trainer publishes and which weights an explorer needs before a step.

One typed policy object (`SyncPlan`) answers every question a service asks about
`synchronizer.sync_style`; no service compares style names (tests/unit/common/test_conventions.py
checks it). Built once from the config (`SyncPlan.from_config`) into each service's settings record:
the synchronizer's core asks `explorer_required_version` / `trainer_should_publish`; the trainer asks
`pipelined()` (send step k's weights while step k+1 trains) and `default_staleness()` (its lease bound);
the explorer asks `explores_until_run_ends()`.

Pure functions of the config (`synchronizer.sync_style`, `sync_interval` I, `sync_offset` K) and a
few counters; the state machine (services/synchronizer/core.py) calls them, tests pin them directly.
Versions are in trainer steps: the weights published after trainer step t are `model_version` t, and
explorer step s (1-based) produces the data of trainer step s (Trinity-RFT's meaning; docs/architecture.md, "The sync plan").

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
`max_head_offpolicyness: 4`; `default_staleness()`). The trainer logs `sample/staleness/{mean,max}`
(its version minus each trained experience's) and `sample/dropped_stale` per step.
    trainer: publish after step t  <=>  t - last_published >= I
    explorer: required(s) = 0   (sync_offset is not used)

Colocated (`cluster.colocate`, veRL's hybrid engine; `colocated`): the trainer and the rollout engines
time-share the same devices, so the phases alternate strictly: an explore step ends with its engines
asleep (`engines_sleep_after_step`), the trainer steps on the batch and publishes, and the next explore
step waits for those weights (fixed or explorer_driven, interval 1, offset 0: the config refuses any
other plan, `colocation_problem`), wakes its engines and loads them.

In every style the trainer also publishes when an explorer waits for a version the trainer already
has (a restarted explorer would otherwise wait for the next interval while the trainer waits for its
data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the config package imports this module (no cycle at run time)
    from services.common.config import RFTConfig

__all__ = ["FULLY_ASYNC_STALE_PUBLISHES", "STYLES", "STYLE_ALIASES", "SyncPlan", "SyncStyle"]

SyncStyle = Literal["fixed", "explorer_driven", "trainer_driven", "fully_async"]
STYLES: tuple[str, ...] = ("fixed", "explorer_driven", "trainer_driven", "fully_async")
STYLE_ALIASES = {"dynamic_by_explorer": "explorer_driven", "dynamic_by_trainer": "trainer_driven"}  # Trinity
# Styles in which an explorer never blocks on the plan (it takes newer weights when there are some).
_NEVER_WAITS: tuple[str, ...] = ("trainer_driven", "fully_async")
# `sync_style: fully_async` bounds staleness by default at this many publishes (x sync_interval trainer
# steps) when no `staleness_control` is set: AReaL's documented `max_head_offpolicyness: 4`.
FULLY_ASYNC_STALE_PUBLISHES = 4


@dataclass(frozen=True)
class SyncPlan:
    """`synchronizer.sync_style`, `sync_interval`, `sync_offset` and the configured staleness bound
    (`staleness`: `sample_strategy_args.max_staleness` with `staleness_control`, else None).
    `offline`: the trainer reads rows of a file (`mode: train` with `trainer_input.experience_buffer.path`),
    which no policy version produced, so no staleness bound applies to them."""

    style: SyncStyle = "fixed"
    interval: int = 1
    offset: int = 0
    staleness: int | None = None
    offline: bool = False
    colocated: bool = False

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"sync_style {self.style!r} is not one of {', '.join(STYLES)}")
        if self.interval < 1 or self.offset < 0:
            raise ValueError(
                f"sync_interval must be >= 1 and sync_offset >= 0, got {self.interval}, {self.offset}"
            )

    @classmethod
    def from_config(cls, config: RFTConfig) -> SyncPlan:
        s, a = config.synchronizer, config.algorithm
        staleness = None
        if a.sample_strategy == "staleness_control":
            staleness = int((a.sample_strategy_args or {}).get("max_staleness", 0))
        offline = config.mode == "train" and bool(config.buffer.trainer_input.experience_buffer.path)
        colocated = config.cluster.colocate and config.mode == "both"  # one side alone has nothing to share
        return cls(s.sync_style, s.sync_interval, s.sync_offset, staleness, offline, colocated)

    # ---- what each role asks ---------------------------------------------------------------------
    def explorer_waits(self) -> bool:
        """Whether an explorer blocks on the plan before a step (fixed, explorer_driven); in the
        other styles it takes what is published, when it is."""
        return self.style not in _NEVER_WAITS

    def pipelined(self) -> bool:
        """Whether no explorer needs step k's weights before step k+1 ends, so the trainer may send
        them while step k+1 trains: `fixed` with `sync_offset` >= 1, or `fully_async`.
        (trainer_driven never waits either, but keeps its synchronous send, as before this object.)"""
        return self.style == "fully_async" or (self.style == "fixed" and self.offset >= 1)

    def pipeline_every(self) -> int:
        """Trainer steps between pipelined syncs (0: the trainer syncs in line after a step)."""
        return self.interval if self.pipelined() else 0

    def engines_sleep_after_step(self) -> bool:
        """Colocated: an explore step puts its engines to sleep (their weights and cache leave the
        device) before the trainer gets its batch; the next step wakes them before loading weights."""
        return self.colocated

    def colocation_problem(self) -> tuple[str, str] | None:
        """Why this plan cannot run colocated, as (config path, message with the fix); None when it
        can (or the run is not colocated). The engines sleep while the trainer steps, so an explore step
        may start only once the weights of the step before are published: an explorer that waits
        (fixed, explorer_driven) with interval 1 and offset 0, veRL's on-policy loop. Every other plan
        rolls out while the trainer steps."""
        if not self.colocated:
            return None
        why = "but cluster.colocate time-shares the GPUs between rollout and training, which cannot overlap on one device"
        fix = "or cluster.colocate: false"
        if not self.explorer_waits():
            return (
                "synchronizer.sync_style",
                f"{self.style}, {why} (the explorer never waits for the trainer's weights); set "
                f"synchronizer.sync_style: fixed with sync_offset: 0, {fix}",
            )
        if self.offset >= 1:
            return (
                "synchronizer.sync_offset",
                f"{self.offset}, {why} (sync_offset >= 1 rolls out while the trainer steps); set "
                f"synchronizer.sync_offset: 0, {fix}",
            )
        if self.interval > 1:
            return (
                "synchronizer.sync_interval",
                f"{self.interval}, {why} (the explorer runs steps between syncs while the trainer steps); "
                f"set synchronizer.sync_interval: 1, {fix}",
            )
        return None

    def explores_until_run_ends(self) -> bool:
        """`fully_async`: the trainer drops experiences staler than its bound, so an explorer explores
        past `buffer.total_steps` until the run finishes."""
        return self.style == "fully_async"

    def default_staleness(self) -> int | None:
        """Most trainer steps an experience's model_version may lag the trainer's (older ones are
        dropped by the buffer): the configured `staleness`; with `fully_async` and none configured,
        FULLY_ASYNC_STALE_PUBLISHES x interval (explorers never wait there, so only this bounds it);
        else None (no bound). Never one for offline rows: they all carry version 0, and a bound would
        drop every row once the trainer passed it, leaving it waiting for data that never comes."""
        if self.offline:
            return None
        if self.staleness is not None:
            return self.staleness
        if self.style == "fully_async":
            return FULLY_ASYNC_STALE_PUBLISHES * self.interval
        return None

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
        return 0  # never waits: the explorer takes what is published, when it is

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
        if not self.explorer_waits():
            return step - last_published_step >= self.interval
        return False
