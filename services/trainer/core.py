"""`TrainerCore`: the trainer's state machine and step loop, with no gRPC in sight.

One step: lease `train_batch_size` experiences (whole groups) from the buffer -> collate -> the
engine's step (log-probs, reward shaping, advantages, updates) -> commit (step counter and data
position move on; a checkpoint is started when due) -> ack the lease -> metrics to the Monitor ->
the sync hook ("after step N, maybe sync weights"; `NoSync` unless a synchronizer is configured).
The hook runs after the core's lock is released (a sync gathers the weights under that lock).
A failure before the commit gives the lease back (nack) so the batch is trained exactly once.

A whole run (`run`, started by `trainer.auto_start`) ends at `total_steps`, on `stop`, or when the
data has ended: once `data_ended()` (the service asks the synchronizer whether every explorer has
stopped) is true, the trainer keeps training on full batches and stops at the first lease that
comes back short. While waiting for data it asks the sync hook again (as Trinity-RFT's trainer
does), so an explorer waiting for weights a failed sync did not deliver cannot deadlock the run. `finish()` then saves the last step (with the HF export unless
`save_hf_checkpoint: never`) and waits for the write.

States: STARTING (before `prepare`), READY (idle), TRAINING (a step in flight), STOPPED, FAILED.
Calls made in the wrong state raise `PreconditionError`; bad arguments raise `InvalidRequest`
naming the field.  The servicer maps them to FAILED_PRECONDITION / INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from services.common.experience import Experience
from services.common.log import get_logger
from services.common.monitor import Monitor
from services.trainer.checkpoint import find_latest
from services.trainer.collate import collate
from services.trainer.engine import TrainEngine
from services.trainer.settings import TrainerSettings

__all__ = [
    "BatchSource",
    "InvalidRequest",
    "LeasedExperiences",
    "NoSync",
    "PreconditionError",
    "StepResult",
    "SyncHook",
    "TrainerCore",
    "TrainerState",
]


log = get_logger("trainer.core")


class PreconditionError(RuntimeError):
    """The call is not allowed in the trainer's current state."""


class InvalidRequest(ValueError):
    """A request argument is out of range; `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class NoBatchError(TimeoutError):
    """No full batch arrived from the buffer within the wait."""


class TrainerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    TRAINING = "training"
    STOPPED = "stopped"
    FAILED = "failed"


class LeasedExperiences(Protocol):
    lease_id: str
    partial: bool

    def decoded(self) -> list[Experience]: ...


class BatchSource(Protocol):
    """The consumer side of the buffer (`services.common.buffer_client.BufferClient` fits)."""

    async def get_batch(
        self, size: int, *, timeout_ms: int = ..., min_model_version: int = ..., lease_ms: int = ...
    ) -> LeasedExperiences: ...

    async def ack(self, lease_id: str) -> int: ...

    async def nack(self, lease_id: str) -> int: ...


class SyncHook(Protocol):
    """Called after every committed step; returns metrics (e.g. `timing_s/sync_weights`)."""

    async def after_step(self, step: int) -> Mapping[str, float]: ...


class NoSync:
    """The default hook: weights move only when someone calls SyncWeights."""

    async def after_step(self, step: int) -> Mapping[str, float]:
        return {}


@dataclasses.dataclass(frozen=True)
class StepResult:
    step: int
    metrics: dict[str, float]
    continue_training: bool


class TrainerCore:
    """Drives a `TrainEngine` from rank 0.  Engine calls run in a thread, one at a time."""

    def __init__(
        self,
        settings: TrainerSettings,
        engine: TrainEngine,
        source: BatchSource | None,
        monitor: Monitor | None = None,
        sync_hook: SyncHook | None = None,
        max_staleness: int | None = None,
    ):
        self.settings = settings
        self.engine = engine
        self.source = source
        self.monitor = monitor
        self.sync_hook: SyncHook = sync_hook or NoSync()
        self.max_staleness = max_staleness
        self.state = TrainerState.STARTING
        self.global_step = 0
        self.consumed_samples = 0
        self.model_version = 0
        self.last_checkpoint = ""
        self.last_metrics: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._saved_step = -1
        self._hf_step = -1
        self._ack: asyncio.Task[None] | None = None  # the last step's ack, sent while its sync runs
        self._unlogged: dict[str, float] | None = None  # a committed step's metrics, until written

    # ---- lifecycle ----------------------------------------------------------------------------
    async def prepare(self) -> None:
        """Resume from the latest checkpoint when `continue_from_checkpoint` and one exists."""
        if self.state is not TrainerState.STARTING:
            raise PreconditionError(f"prepare() called in state {self.state.value}")
        folder = find_latest(self.settings.job_dir) if self.settings.resume else None
        if folder is not None:
            async with self._lock:
                state = await asyncio.to_thread(self.engine.load_checkpoint, str(folder))
            self.global_step = int(state["global_step"])
            self.consumed_samples = int(state.get("consumed_samples", 0))
            self.model_version = int(state.get("model_version", self.global_step))
            self.last_checkpoint = str(folder)
            self._saved_step = self.global_step
        self.state = TrainerState.READY

    @property
    def finished(self) -> bool:
        total = self.settings.total_steps
        return total is not None and self.global_step >= total

    def _require(self, *states: TrainerState) -> None:
        if self.state not in states:
            allowed = ", ".join(s.value for s in states)
            raise PreconditionError(f"trainer is {self.state.value}; this needs {allowed}")

    # ---- the step -----------------------------------------------------------------------------
    async def train_step(self, timeout_ms: int = 60_000) -> StepResult:
        """Lease a batch, train on it, commit, ack.  Raises `NoBatchError` if none came in time."""
        if timeout_ms < 0:
            raise InvalidRequest("timeout_ms", f"{timeout_ms} must be >= 0")
        self._require(TrainerState.READY)
        if self.source is None:
            raise PreconditionError("trainer has no buffer to lease batches from")
        if self.finished:
            return StepResult(self.global_step, {}, False)
        async with self._lock:
            self._require(TrainerState.READY)
            self.state = TrainerState.TRAINING
            try:
                metrics = await self._step_locked(timeout_ms)
            except BaseException:
                self._log_committed({})  # cut short after its commit: the step's line is still written
                raise
            finally:
                if self.state is TrainerState.TRAINING:
                    self.state = TrainerState.READY
        sync_metrics: dict[str, float] = {}
        try:
            sync_metrics = dict(await self.sync_hook.after_step(self.global_step))
        finally:  # the step is committed: its metrics line is written even if the sync is cut short
            self._log_committed(sync_metrics)
        return StepResult(self.global_step, metrics, not self.finished)

    def _log_committed(self, extra: Mapping[str, float]) -> None:
        """Write the metrics line of the last committed step, once."""
        metrics, self._unlogged = self._unlogged, None
        if metrics is None:
            return
        metrics |= extra
        self.last_metrics = metrics
        if self.monitor is not None:
            self.monitor.log(metrics, self.global_step)

    async def _settle_ack(self) -> None:
        """Wait for the previous step's ack (an error surfaces here, before the next lease)."""
        ack, self._ack = self._ack, None
        if ack is not None:
            await ack

    async def _step_locked(self, timeout_ms: int) -> dict[str, float]:
        assert self.source is not None
        await self._settle_ack()
        size = self.settings.train_batch_size
        t0 = time.perf_counter()
        min_version = max(0, self.model_version - self.max_staleness) if self.max_staleness is not None else 0
        leased = await self.source.get_batch(size, timeout_ms=timeout_ms, min_model_version=min_version)
        experiences = leased.decoded() if leased.lease_id else []
        if len(experiences) < size:
            if leased.lease_id:
                await self.source.nack(leased.lease_id)
            raise NoBatchError(
                f"only {len(experiences)} of {size} experiences arrived within {timeout_ms} ms"
            )
        t1 = time.perf_counter()
        try:
            step_batch = collate(experiences, self.engine.pad_token_id)
            metrics = await asyncio.to_thread(self.engine.train_step, step_batch)
        except BaseException:
            await self.source.nack(leased.lease_id)
            self.state = TrainerState.FAILED
            raise
        # commit: the weights moved, so do the step counter and the data position
        self.global_step += 1
        self.model_version = self.global_step
        self.consumed_samples += len(experiences)
        t2 = time.perf_counter()
        metrics = dict(metrics) | {
            "timing_s/read_experience": t1 - t0,
            "timing_s/train_step": t2 - t1,
            "sample/model_version/mean": sum(e.model_version for e in experiences) / len(experiences),
            "sample/task_count": float(len({e.eid.group_id for e in experiences})),
        }
        self._unlogged = metrics  # from here on the step is committed (see `_log_committed`)
        if self._save_due():
            await self._save_locked(block=False, save_as_hf=self._hf_due())
        # the ack goes out while the weight sync runs (settled before the next lease, at the end of
        # the run and at shutdown), so it is off the path from the update to the explorer
        self._ack = asyncio.create_task(self.source.ack(leased.lease_id))
        t3 = time.perf_counter()
        metrics["timing_s/save_checkpoint"] = t3 - t2
        metrics["timing_s/step"] = t3 - t0
        return metrics

    def _save_due(self) -> bool:
        s = self.settings
        return self.finished or bool(s.save_interval and self.global_step % s.save_interval == 0)

    def _hf_due(self) -> bool:
        policy = self.settings.save_hf_checkpoint
        return policy == "always" or (policy == "last" and self.finished)

    # ---- checkpoints --------------------------------------------------------------------------
    def trainer_state(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "consumed_samples": self.consumed_samples,
            "model_version": self.model_version,
            "world_size": self.engine.world_size,
        }

    async def _save_locked(self, block: bool, save_as_hf: bool) -> tuple[str, str]:
        path = await asyncio.to_thread(
            self.engine.save_checkpoint, self.global_step, self.trainer_state(), save_as_hf, block
        )
        self._saved_step = self.global_step
        if save_as_hf:
            self._hf_step = self.global_step
        self.last_checkpoint = path
        return path, (f"{path}/huggingface" if save_as_hf else "")

    async def save_checkpoint(
        self, block_until_saved: bool = False, save_as_hf: bool = False
    ) -> tuple[int, str, str]:
        """Save `global_step_<step>` now (unless this step is saved already, then only wait/export)."""
        self._require(TrainerState.READY)
        async with self._lock:
            if self._saved_step == self.global_step and not save_as_hf:
                if block_until_saved:
                    await asyncio.to_thread(self.engine.wait_for_save)
                return self.global_step, self.last_checkpoint, ""
            path, hf = await self._save_locked(block_until_saved, save_as_hf)
            return self.global_step, path, hf

    async def wait_for_save(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self.engine.wait_for_save)

    # ---- whole run and shutdown ---------------------------------------------------------------
    async def run(
        self,
        timeout_ms: int = 60_000,
        stop: asyncio.Event | None = None,
        data_ended: Callable[[], Awaitable[bool]] | None = None,
    ) -> int:
        """Train until `total_steps`, `stop`, or the end of the data (see the module docstring);
        returns the last step."""
        draining = False
        while not self.finished and not (stop is not None and stop.is_set()):
            try:
                await self.train_step(timeout_ms)
            except NoBatchError:
                if draining:
                    break
                if self.global_step:  # an explorer may wait for weights the last sync failed to send
                    await self.sync_hook.after_step(self.global_step)
                # checked after a short lease, so one more lease sees everything put before the end
                draining = data_ended is not None and await data_ended()
        return self.global_step

    async def finish(self) -> str:
        """End of a run: save the last step unless saved (HF export per `save_hf_checkpoint`, `last`
        included) and wait until it is written; returns the checkpoint folder ("" before any step)."""
        self._require(TrainerState.READY)
        hf = self.settings.save_hf_checkpoint != "never"
        async with self._lock:
            await self._settle_ack()
            if self.global_step > 0 and (
                self._saved_step != self.global_step or (hf and self._hf_step != self.global_step)
            ):
                await self._save_locked(block=True, save_as_hf=hf)
            await asyncio.to_thread(self.engine.wait_for_save)
        return self.last_checkpoint

    async def shutdown(self, wait_for_save: bool = True) -> None:
        """Flush pending saves (when asked), release the worker ranks and stop."""
        if self.state is TrainerState.STOPPED:
            return
        async with self._lock:
            try:
                await self._settle_ack()
            except Exception as exc:  # the lease expires and the batch is redelivered; say so
                log.warning("last ack failed", error=f"{type(exc).__name__}: {exc}")
            if wait_for_save:
                await asyncio.to_thread(self.engine.wait_for_save)
            self.state = TrainerState.STOPPED
            await asyncio.to_thread(self.engine.close)
            if self.monitor is not None:
                self.monitor.close()

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "step": self.global_step,
            "total_steps": self.settings.total_steps or 0,
            "model_version": self.model_version,
            "world_size": self.engine.world_size,
            "last_checkpoint": self.last_checkpoint,
            "last_metrics": dict(self.last_metrics),
        }
