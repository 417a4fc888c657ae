"""`TrainerCore`: the trainer's state machine and step loop, with no gRPC in sight.

One step: lease `train_batch_size` experiences (whole groups) from the buffer -> collate -> the
engine's step (log-probs, reward shaping, advantages, updates) -> commit (step counter and data
position move on, the step's lineage is recorded; a checkpoint is started when due) -> metrics to the
Monitor -> the sync hook ("after step N, maybe sync weights"; `NoSync` unless a synchronizer is
configured). The hook runs after the core's lock is released (a sync gathers the weights under that
lock). A failure before the commit gives the lease back (nack).

Exactly once into the model: a lease is acked only once a checkpoint holding its step is durable
(its marker written), so a crash before that gives the batch back. Each checkpoint records the
lineage (`services.common.lineage`: the uids every step up to it trained) and the leases of its steps
not yet acked; `prepare` takes the buffer consumer over (`open_consumer`: the restored checkpoint's
unacked leases are acked, every other lease of the dead predecessor comes back at once, and the
predecessor is fenced). A step in flight when the task is cancelled runs to its commit first, so a
stop never leaves weights that hold an update the step counter does not. While the trainer waits
for data with steps not yet durable it saves, so unacked leases cannot fill the buffer.

A whole run (`run`, started by `trainer.auto_start`) ends at `total_steps`, on `stop`, or when the
data has ended: once `data_ended()` (the service asks the synchronizer whether every explorer has
finished its data) is true, the trainer keeps training on full batches and stops at the first lease
that comes back short. While waiting for data it asks the sync hook again (as Trinity-RFT's trainer
does), so an explorer waiting for weights a failed sync did not deliver cannot deadlock the run. `finish()` then saves the last step (with the HF export unless
`save_hf_checkpoint: never`) and waits for the write.

With `max_staleness` (staleness_control, or `sync_style: fully_async`'s default) a lease takes only
experiences of model_version >= the trainer's version - max_staleness (the buffer drops older ones);
each step logs `sample/staleness/{mean,max}` (trainer version - experience version) and
`sample/dropped_stale` (dropped since the previous step). Per token (staleness.py: experiences whose
tokens came from several versions, in-flight weight updates) it logs `sample/token_staleness/{mean,max}`
and `sample/mixed_version_fraction`, and tokens older than the bound get no loss.

States: STARTING (before `prepare`), READY (idle), TRAINING (a step in flight), STOPPED, FAILED.
Calls made in the wrong state raise `PreconditionError`; bad arguments raise `InvalidRequest`
naming the field.  The servicer maps them to FAILED_PRECONDITION / INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from services.common import tracing
from services.common.buffer_client import LeaseUnknown
from services.common.experience import Experience
from services.common.lineage import StepLineage, experience_uid, read_lineage, write_lineage
from services.common.log import get_logger
from services.common.monitor import Monitor
from services.trainer.checkpoint import discard_after, find_latest, step_dir
from services.trainer.collate import collate
from services.trainer.engine import TrainEngine
from services.trainer.replay_record import ReplayRecorder, tensor_digests
from services.trainer.settings import TrainerSettings
from services.trainer.staleness import mask_stale_tokens, token_staleness_metrics

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
SHUTDOWN_ACK_S = 10.0  # how long a stopping trainer tries to ack its durable steps


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
    dropped_stale: int  # experiences the buffer dropped for this lease (older than min_model_version)

    def decoded(self) -> list[Experience]: ...


class BatchSource(Protocol):
    """The consumer side of the buffer (`services.common.buffer_client.BufferClient` fits)."""

    async def get_batch(
        self, size: int, *, timeout_ms: int = ..., min_model_version: int = ..., lease_ms: int = ...
    ) -> LeasedExperiences: ...

    async def ack(self, lease_id: str) -> int: ...

    async def nack(self, lease_id: str) -> int: ...

    async def open_consumer(self, ack_lease_ids: Sequence[str] = ...) -> Any:
        """Take this consumer over: ack `ack_lease_ids`, release the predecessor's other leases."""


class SyncHook(Protocol):
    """Called after every committed step; returns metrics (e.g. `timing_s/sync_weights`). A hook
    may send in the background; `flush` waits for what it has in flight (at the end of a run)."""

    async def after_step(self, step: int) -> Mapping[str, float]: ...

    async def flush(self) -> Mapping[str, float]: ...


class NoSync:
    """The default hook: weights move only when someone calls SyncWeights."""

    async def after_step(self, step: int) -> Mapping[str, float]:
        return {}

    async def flush(self) -> Mapping[str, float]:
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
        self._dropped_stale = 0  # dropped by the staleness bound since the last committed step
        self.dropped_stale_total = 0  # since this process started (not kept in checkpoints)
        self.state = TrainerState.STARTING
        self.global_step = 0
        self.consumed_samples = 0
        self.model_version = 0
        self.last_checkpoint = ""
        self.last_metrics: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._saved_step = -1
        self._hf_step = -1
        self._ack: asyncio.Task[None] | None = None  # acks of durable steps, sent while a step runs
        self._unlogged: dict[str, float] | None = None  # a committed step's metrics, until written
        self.lineage: list[StepLineage] = []  # every trained step of the run, restored from checkpoints
        self._unacked: list[tuple[int, str]] = []  # (step, lease id): trained, acked once durable
        self.replay: ReplayRecorder | None = None  # per-step records for `rft replay` (one rank only)
        if settings.replay_keep_steps:
            if engine.world_size == 1:
                self.replay = ReplayRecorder(
                    settings.job_dir, settings.replay_keep_steps, settings.replay_keep_bytes
                )
            else:
                log.warning(
                    "trainer.replay_keep_steps: no replay records with several ranks (not supported yet)"
                )

    # ---- lifecycle ----------------------------------------------------------------------------
    async def prepare(self) -> None:
        """Resume from the latest checkpoint when `continue_from_checkpoint` and one exists."""
        if self.state is not TrainerState.STARTING:
            raise PreconditionError(f"prepare() called in state {self.state.value}")
        folder = find_latest(self.settings.job_dir) if self.settings.resume else None
        unacked: list[str] = []
        if folder is not None:
            async with self._lock:
                state = await asyncio.to_thread(self.engine.load_checkpoint, str(folder))
            self.global_step = int(state["global_step"])
            self.consumed_samples = int(state.get("consumed_samples", 0))
            self.model_version = int(state.get("model_version", self.global_step))
            self.last_checkpoint = str(folder)
            self._saved_step = self.global_step
            self.lineage = await asyncio.to_thread(read_lineage, folder)
            unacked = [str(lid) for lid in state.get("unacked_leases", [])]
        if self.settings.resume:  # folders after the restored step hold steps that are trained again
            await asyncio.to_thread(discard_after, self.settings.job_dir, self.global_step)
            if self.replay is not None:
                await asyncio.to_thread(self.replay.discard_after, self.global_step)
        if self.source is not None:
            opened = await self.source.open_consumer(unacked)
            log.info(
                "buffer consumer taken over",
                step=self.global_step,
                epoch=getattr(opened, "epoch", None),
                acked=getattr(opened, "acked", None),
                released=getattr(opened, "released", None),
            )
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
        with tracing.span("trainer.step") as span:
            result = await self._train_step(timeout_ms)
            if span is not None:
                span.set_attribute("rft.step", result.step)
            return result

    async def _train_step(self, timeout_ms: int) -> StepResult:
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
        """Wait for the acks in flight (an error surfaces here, before the next lease)."""
        ack, self._ack = self._ack, None
        if ack is not None:
            await ack

    def _start_acks(self) -> None:
        """Ack, in the background, the leases of every step a durable checkpoint holds."""
        if self._ack is not None or self.source is None:
            return
        durable = self.engine.durable_step()
        ready = [(s, lid) for s, lid in self._unacked if s <= durable]
        if ready:
            self._ack = asyncio.create_task(self._ack_leases(ready))

    async def _ack_leases(self, ready: list[tuple[int, str]]) -> None:
        assert self.source is not None
        for item in ready:
            try:
                await self.source.ack(item[1])
            except LeaseUnknown as exc:  # the buffer forgot it (a memory store that restarted)
                log.warning("a durable step's lease is unknown to the buffer", step=item[0], error=str(exc))
            self._unacked.remove(item)

    async def _ack_durable(self) -> None:
        """Ack every lease a durable checkpoint holds, now (end of a run, shutdown)."""
        await self._settle_ack()
        self._start_acks()
        await self._settle_ack()

    async def _step_locked(self, timeout_ms: int) -> dict[str, float]:
        assert self.source is not None
        await self._settle_ack()
        self._start_acks()
        size = self.settings.train_batch_size
        t0 = time.perf_counter()
        min_version = max(0, self.model_version - self.max_staleness) if self.max_staleness is not None else 0
        with tracing.span("trainer.get_batch") as span:
            leased = await self.source.get_batch(size, timeout_ms=timeout_ms, min_model_version=min_version)
            self._count_dropped(leased.dropped_stale, min_version)
            experiences = leased.decoded() if leased.lease_id else []
            tracing.link_stamped(span, experiences)  # to the explorers' puts that brought them
        if len(experiences) < size:
            if leased.lease_id:
                await self.source.nack(leased.lease_id)
            raise NoBatchError(
                f"only {len(experiences)} of {size} experiences arrived within {timeout_ms} ms"
            )
        t1 = time.perf_counter()
        stale_tokens = mask_stale_tokens(experiences, min_version)
        cancelled = False
        try:
            step_batch = collate(experiences, self.engine.pad_token_id)
            with tracing.span("trainer.update"):  # its thread carries the span on (phases: worker.py)
                work = asyncio.ensure_future(asyncio.to_thread(self.engine.train_step, step_batch))
                try:
                    metrics = await asyncio.shield(work)
                except asyncio.CancelledError:
                    # the update runs on in its thread: let it end and commit it, then stop
                    metrics, cancelled = await work, True
        except BaseException:
            await self.source.nack(leased.lease_id)
            self.state = TrainerState.FAILED
            raise
        staleness = [self.model_version - e.model_version for e in experiences]  # before the commit
        token_staleness = token_staleness_metrics(experiences, self.model_version)
        # commit: the weights moved, so do the step counter, the data position and the lineage
        self.global_step += 1
        self.model_version = self.global_step
        self.consumed_samples += len(experiences)
        self.lineage.append(
            StepLineage(self.global_step, leased.lease_id, tuple(experience_uid(e.eid) for e in experiences))
        )
        self._unacked.append((self.global_step, leased.lease_id))
        recorded = await self._record_step(leased.lease_id, experiences, metrics) if self.replay else {}
        t2 = time.perf_counter()
        metrics = dict(metrics) | {
            "timing_s/read_experience": t1 - t0,
            "timing_s/train_step": t2 - t1,
            "sample/model_version/mean": sum(e.model_version for e in experiences) / len(experiences),
            # trainer version - experience version (0 = on-policy); bounded by max_staleness when set
            "sample/staleness/mean": sum(staleness) / len(staleness),
            "sample/staleness/max": float(max(staleness)),
            "sample/dropped_stale": float(self._dropped_stale),  # since the previous step
            "sample/dropped_stale_total": float(self.dropped_stale_total),
            **token_staleness,
            **recorded,
            "sample/stale_tokens_masked": float(stale_tokens),
            "sample/task_count": float(len({e.eid.group_id for e in experiences})),
        }
        self._dropped_stale = 0
        self._unlogged = metrics  # from here on the step is committed (see `_log_committed`)
        if cancelled:
            raise asyncio.CancelledError
        if self._save_due():
            with tracing.span("trainer.save"):
                await self._save_locked(block=False, save_as_hf=self._hf_due())
        # acks of durable steps go out while the next step and the weight sync run (settled before
        # the next lease, at the end of the run and at shutdown), off the path to the explorer
        self._start_acks()
        t3 = time.perf_counter()
        metrics["timing_s/save_checkpoint"] = t3 - t2
        metrics["timing_s/step"] = t3 - t0
        metrics["trainer/unacked_steps"] = float(len(self._unacked))
        return metrics

    async def _record_step(
        self, lease_id: str, experiences: list[Experience], metrics: Mapping[str, float]
    ) -> dict[str, float]:
        """Write the committed step's replay record (its batch, the engine's metrics, the weights'
        digest); returns its `timing_s/replay_record`. A failed write is logged, never fails the step."""
        assert self.replay is not None
        t0 = time.perf_counter()
        try:
            digest = await asyncio.to_thread(lambda: tensor_digests(self.engine.iter_state_dict()))
            await asyncio.to_thread(
                self.replay.write, self.global_step, lease_id, experiences, dict(metrics), digest
            )
        except OSError as exc:
            log.warning("replay record not written", step=self.global_step, error=str(exc))
        return {"timing_s/replay_record": time.perf_counter() - t0}

    def _count_dropped(self, dropped: int, min_version: int) -> None:
        """The buffer dropped `dropped` experiences older than `min_version` for this lease."""
        if dropped <= 0:
            return
        self._dropped_stale += dropped
        self.dropped_stale_total += dropped
        log.warning("stale experiences dropped", dropped=dropped, min_model_version=min_version,
                    max_staleness=self.max_staleness, trainer_version=self.model_version)  # fmt: skip

    def _save_due(self) -> bool:
        s = self.settings
        # batches wait in the buffer, unacked, until a durable step holds them: save before they
        # take half its room, whatever `save_interval` says, so producers never stall on them
        held = len(self._unacked) * s.train_batch_size
        crowded = held + s.train_batch_size > s.buffer_capacity // 2
        crowded = crowded and self.engine.durable_step() >= self._saved_step  # no save in flight
        return self.finished or crowded or bool(s.save_interval and self.global_step % s.save_interval == 0)

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
            # leases of the saved steps not acked yet: acked by the next trainer's open_consumer
            "unacked_leases": [lid for _, lid in self._unacked],
        }

    async def _save_locked(self, block: bool, save_as_hf: bool) -> tuple[str, str]:
        # the lineage goes on disk before the engine writes the marker that makes the step durable
        folder = step_dir(self.settings.job_dir, self.global_step)
        await asyncio.to_thread(_write_lineage, folder, list(self.lineage))
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
        """Save `global_step_<step>` now (unless this step is saved already, then only wait/export);
        with `block_until_saved`, the batches of the steps it holds are acked before it returns."""
        self._require(TrainerState.READY)
        async with self._lock:
            if self._saved_step == self.global_step and not save_as_hf:
                if block_until_saved:
                    await asyncio.to_thread(self.engine.wait_for_save)
                    await self._ack_durable()
                return self.global_step, self.last_checkpoint, ""
            path, hf = await self._save_locked(block_until_saved, save_as_hf)
            if block_until_saved:  # the steps it holds are durable: their batches are acked now
                await self._ack_durable()
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
                if self._saved_step != self.global_step and self._unacked:
                    # no data while leases wait for a durable step: save, so the acks free the buffer
                    await self.save_checkpoint()
                if self.global_step:  # an explorer may wait for weights the last sync failed to send
                    await self.sync_hook.after_step(self.global_step)
                # checked after a short lease, so one more lease sees everything put before the end
                draining = data_ended is not None and await data_ended()
        await self.sync_hook.flush()  # the last step's weights are out before the run ends
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
            await self._ack_durable()
        return self.last_checkpoint

    async def shutdown(self, wait_for_save: bool = True) -> None:
        """Stop: save the last committed step unless saved (when `wait_for_save`; a stop by SIGTERM
        or SIGINT keeps every trained step), ack what is durable, release the worker ranks."""
        if self.state is TrainerState.STOPPED:
            return
        async with self._lock:
            try:
                await self._settle_ack()
                if (
                    wait_for_save
                    and self.state is TrainerState.READY
                    and 0 < self.global_step != self._saved_step
                ):
                    log.info("saving the last trained step before stopping", step=self.global_step)
                    await self._save_locked(block=True, save_as_hf=False)
                if wait_for_save:
                    await asyncio.to_thread(self.engine.wait_for_save)
                    # bounded: a buffer that is gone cannot be waited for; the checkpoint lists the
                    # leases still unacked and the next trainer acks them when it takes over
                    await asyncio.wait_for(self._ack_durable(), SHUTDOWN_ACK_S)
            except Exception as exc:  # unacked steps are delivered again after a restart; say so
                log.warning("stop: the last save or ack failed", error=f"{type(exc).__name__}: {exc}")
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


def _write_lineage(folder: Any, steps: list[StepLineage]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_lineage(folder, steps)
