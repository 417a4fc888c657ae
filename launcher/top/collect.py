"""One `Snapshot` of a running job for `rft top`: each service's `rft.v1.Liveness/Progress` (step, how
long since it moved, uptime), the explorers' and trainer's `Status`, the buffer's `Stats` and the
synchronizer's `GetRunState`, every call with a short deadline, all at once; a service that does not
answer is recorded as such (with the gRPC code) and the rest is still shown. With a job folder, its
metrics/*.jsonl (the reward curve; the trainer's step time, tokens/s and loss when `Status` carries
none) and synchronizer/events.jsonl (the last syncs) are read incrementally, only new lines each frame."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rft.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    common_pb2,
    explorer_pb2,
    explorer_pb2_grpc,
    liveness_pb2,
    liveness_pb2_grpc,
    synchronizer_pb2,
    synchronizer_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)

from launcher.progress import MetricsTail
from launcher.top.targets import Target, Targets
from services.common.rpc.client import create_channel

TIMEOUT_S = 3.0  # per call; a loaded host takes a while to connect and answer
REWARDS_KEPT = 240
SYNC_EVENTS = ("publish", "reported", "rebroadcast", "lost", "left")
# what a call that got no answer raises (ValueError: a TLS file the config names cannot be read)
ERRORS = (grpc.RpcError, OSError, ValueError)
LOSS_KEYS = ("actor/pg_loss", "actor/sft_loss", "actor/dpo_loss", "critic/vf_loss")


@dataclass
class ServiceView:
    name: str
    kind: str
    address: str
    answered: bool = False
    error: str = ""  # why there is no answer
    unit: str = ""
    step: int = 0
    moved_age_s: float = 0.0
    heartbeat_age_s: float = 0.0
    uptime_s: float = 0.0
    pid: int = 0
    restarts: int | None = None
    stuck: str = ""  # its work in flight has not moved for its limit (services/common/progress.py)


@dataclass
class ExplorerView:
    name: str
    answered: bool = False
    status: str = ""
    step: int = 0
    version: int = 0
    steps_per_s: float | None = None
    tokens_per_s: float | None = None
    reward: float | None = None


@dataclass
class BufferView:
    answered: bool = False
    stats: buffer_pb2.StatsResponse = field(default_factory=buffer_pb2.StatsResponse)  # its answer

    @property
    def oldest_version(self) -> int | None:
        """The oldest model version of a stored experience."""
        return min((v for v, n in self.stats.per_model_version.items() if n > 0), default=None)


@dataclass
class TrainerView:
    answered: bool = False
    status: str = ""
    step: int = 0
    total_steps: int = 0
    version: int = 0
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    loss: tuple[str, float] | None = None


@dataclass
class SyncEvent:
    age_s: float
    kind: str
    member: str
    version: int
    detail: str = ""


@dataclass
class SyncView:
    answered: bool = False
    version: int = 0
    method: str = ""
    in_progress: bool = False
    finished: bool = False
    members: list[tuple[str, str, int]] = field(default_factory=list)  # (id, status, version held)
    events: list[SyncEvent] = field(default_factory=list)  # newest last


@dataclass
class Snapshot:
    source: str
    services: list[ServiceView] = field(default_factory=list)
    explorers: list[ExplorerView] = field(default_factory=list)
    buffer: BufferView | None = None  # None: no buffer among the targets
    trainer: TrainerView | None = None
    sync: SyncView | None = None
    rewards: list[float] = field(default_factory=list)
    taken_at: float = field(default_factory=time.time)


def _status(value: int) -> str:
    name = common_pb2.MemberStatus.Name(value) if value in common_pb2.MemberStatus.values() else str(value)
    return name.removeprefix("MEMBER_STATUS_").lower()


def _why(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return exc.code().name
    return type(exc).__name__


def _loss(metrics: dict[str, Any]) -> tuple[str, float] | None:
    for key in LOSS_KEYS:
        if metrics.get(key) is not None:
            return key.rsplit("/", 1)[-1], float(metrics[key])
    return None


class Collector:
    """Keeps the channels and what a frame needs from the frames before (the reward curve, the
    explorers' steps for their rate, the metrics files' read offsets); `snapshot()` takes one frame."""

    def __init__(self, targets: Targets, timeout_s: float = TIMEOUT_S):
        self.targets, self.timeout_s = targets, timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._rewards: deque[float] = deque(maxlen=REWARDS_KEPT)
        self._steps: dict[str, tuple[float, int]] = {}  # explorer -> (when, step) of the previous frame
        self._events: deque[dict[str, Any]] = deque(maxlen=6)
        self._trainer_last: dict[str, Any] = {}
        job = targets.job_dir
        self._tails: dict[Path, MetricsTail] = {}
        self._events_tail = MetricsTail(job / "synchronizer" / "events.jsonl") if job else None
        self._last_reward_step: dict[str, int] = {}

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = create_channel(
                address, auth_token=self.targets.auth_token, tls=self.targets.tls,
                timeout_s=self.timeout_s, retries=2,
            )  # fmt: skip
        return self._channels[address]

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    # ------------------------------------------------------------------ one frame
    async def snapshot(self) -> Snapshot:
        self.targets.reread_ports()
        self._read_files()
        snap = Snapshot(source=self.targets.source)
        jobs = []
        for target in self.targets.services:
            view = ServiceView(target.name, target.kind, target.address, restarts=target.restarts())
            snap.services.append(view)
            jobs.append(self._progress(target, view))
            if target.kind == "explorer":
                ex = ExplorerView(target.name)
                snap.explorers.append(ex)
                jobs.append(self._explorer(target, ex))
            elif target.kind == "buffer":
                snap.buffer = BufferView()
                jobs.append(self._buffer(target, snap.buffer))
            elif target.kind == "trainer":
                snap.trainer = TrainerView()
                jobs.append(self._trainer(target, snap.trainer))
            elif target.kind == "synchronizer":
                snap.sync = SyncView()
                jobs.append(self._sync(target, snap.sync))
        await asyncio.gather(*jobs)
        if snap.trainer is not None and self._trainer_last:
            self._fill_trainer(snap.trainer, self._trainer_last, only_missing=True)
        if snap.sync is not None:
            now = time.time()
            snap.sync.events = [
                SyncEvent(max(0.0, now - float(e.get("time", now))), str(e.get("kind", "")),
                          str(e.get("member_id", "")), int(e.get("version", 0)), str(e.get("detail", "")))
                for e in self._events
            ]  # fmt: skip
        snap.rewards = list(self._rewards)
        return snap

    def _read_files(self) -> None:
        job = self.targets.job_dir
        if job is None:
            return
        metrics = job / "metrics"
        for path in sorted(metrics.glob("explorer*.jsonl")):
            tail = self._tails.setdefault(path, MetricsTail(path))
            for rec in tail.read_new():
                if rec.get("rollout/reward/mean") is not None:
                    self._rewards.append(float(rec["rollout/reward/mean"]))
        trainer = self._tails.setdefault(metrics / "trainer.jsonl", MetricsTail(metrics / "trainer.jsonl"))
        for rec in trainer.read_new():
            self._trainer_last = rec
        if self._events_tail is not None:
            self._events.extend(e for e in self._events_tail.read_new() if e.get("kind") in SYNC_EVENTS)

    async def _call(self, target: Target, stub: Any, method: str, request: Any) -> Any:
        """`stub(channel).method(request)` on the target, within the call deadline."""
        if not target.address:
            raise ConnectionError("no port yet")
        return await getattr(stub(self._channel(target.address)), method)(request, timeout=self.timeout_s)

    async def _ask(self, target: Target, stub: Any, method: str, request: Any) -> Any:
        """As `_call`, or None when the target did not answer (its `ServiceView` says why)."""
        try:
            return await self._call(target, stub, method, request)
        except ERRORS:
            return None

    async def _progress(self, target: Target, view: ServiceView) -> None:
        try:
            reply = await self._call(
                target, liveness_pb2_grpc.LivenessStub, "Progress", liveness_pb2.ProgressRequest()
            )
        except ERRORS as exc:
            view.error = "no port yet" if not target.address else _why(exc)
            return
        view.answered = True
        view.unit, view.step, view.pid, view.stuck = reply.unit, reply.step, reply.pid, reply.stuck
        view.moved_age_s, view.heartbeat_age_s, view.uptime_s = (
            reply.moved_age_s,
            reply.heartbeat_age_s,
            reply.uptime_s,
        )

    async def _explorer(self, target: Target, view: ExplorerView) -> None:
        reply = await self._ask(
            target, explorer_pb2_grpc.ExplorerServiceStub, "Status", explorer_pb2.ExplorerStatusRequest()
        )
        if reply is None:
            return
        metrics = dict(reply.last_metrics)
        view.answered, view.status, view.step = True, _status(reply.status), reply.step
        view.version = reply.model_version.version
        view.tokens_per_s = metrics.get("rollout/tokens_per_s")
        view.reward = metrics.get("rollout/reward/mean")
        now = time.monotonic()
        before = self._steps.get(target.name)
        if before is not None and reply.step > before[1] and now > before[0]:
            view.steps_per_s = (reply.step - before[1]) / (now - before[0])
        elif metrics.get("time/explore_step"):
            view.steps_per_s = 1.0 / metrics["time/explore_step"]
        if before is None or reply.step != before[1]:
            self._steps[target.name] = (now, reply.step)
        # no metrics files: the curve from here, one point per explore step
        if (
            self.targets.job_dir is None
            and view.reward is not None
            and self._last_reward_step.get(target.name) != reply.step
        ):
            self._last_reward_step[target.name] = reply.step
            self._rewards.append(float(view.reward))

    async def _buffer(self, target: Target, view: BufferView) -> None:
        r = await self._ask(target, buffer_pb2_grpc.BufferServiceStub, "Stats", buffer_pb2.StatsRequest())
        if r is not None:
            view.answered, view.stats = True, r

    async def _trainer(self, target: Target, view: TrainerView) -> None:
        r = await self._ask(
            target, trainer_pb2_grpc.TrainerServiceStub, "Status", trainer_pb2.StatusRequest()
        )
        if r is None:
            return
        view.answered, view.status, view.step, view.total_steps = (
            True,
            _status(r.status),
            r.step,
            r.total_steps,
        )
        view.version = r.model_version.version
        self._fill_trainer(view, dict(r.last_metrics))

    @staticmethod
    def _fill_trainer(view: TrainerView, metrics: dict[str, Any], only_missing: bool = False) -> None:
        if not only_missing or view.step_time_s is None:
            view.step_time_s = metrics.get("perf/time_per_step")
        if not only_missing or view.tokens_per_s is None:
            view.tokens_per_s = metrics.get("perf/throughput")
        if not only_missing or view.loss is None:
            view.loss = _loss(metrics)
        if only_missing and not view.answered and metrics.get("step") is not None:
            view.step = int(metrics["step"])

    async def _sync(self, target: Target, view: SyncView) -> None:
        r = await self._ask(
            target,
            synchronizer_pb2_grpc.SynchronizerServiceStub,
            "GetRunState",
            synchronizer_pb2.GetRunStateRequest(),
        )
        if r is None:
            return
        view.answered, view.version, view.method = True, r.model_version.version, r.sync_method
        view.in_progress, view.finished = r.sync_in_progress, r.finished
        view.members = [(m.member_id, _status(m.status), m.model_version) for m in r.members]
