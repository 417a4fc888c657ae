"""The trainer's side of weight sync, on top of `services.weight_sync`.

- `get_info(receivers)`: tensor metadata of the policy (HF names, gathered once from the FSDP2
  shards) and a fresh rendezvous on rank 0 (`NcclTransport.prepare`), generation + 1.
- `setup(group)`: rank 0 joins the broadcast group it handed out (blocks until every receiver joins).
- `join(info, rank)`: rank 0 joins a group the synchronizer handed out. With a synchronizer, it is
  the authority on generations and ports (it rebuilds the group when explorers come and go), so the
  trainer takes its `GroupInfo` as given instead of offering one (`TrainerSyncHook.join_group`).
- `teardown(generation)`: leaves the group.
- `sync(method)`: gathers the full state dict (a collective over the trainer ranks, one parameter at
  a time in the training compute dtype, `weight_gather`: kept on the GPU for a broadcast method, one
  host copy for the others) and hands it to
  the method's strategy (`services.weight_sync.method.SyncMethod.send`) with what it may send
  through: the joined broadcast group, the `push` to the synchronizer (`PushWeights`) and the
  transport options (checkpoints go under `<job_dir>/state_dicts/`). The version sent is the
  trainer's current `model_version`; `nbytes` is what the method put on the wire. Given a
  `snapshot()` taken earlier, it sends that instead: the pipelined sync (`sync_offset` >= 1) takes
  the snapshot right after step k and sends it while step k+1 trains.
  With `digest=True` the result carries `weights_digest` of what was sent (bit-exactness checks).

All engine work (the gather) is serialised with the core's lock, so a gather never overlaps a step.
Sending a snapshot runs beside the next step (it reads private copies), but its collectives never
run beside the step's: the engine call and the broadcast send each hold the device's
`issuing_collectives` lock (`services.common.collective_lock`; NCCL may deadlock when two threads
issue collectives of two communicators on one GPU), so on the device the send waits for the step's
collectives or the step for the send's, while the explorers' receive and generation overlap the step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import torch
from rft.v1 import common_pb2

from services.common.registry import UnknownNameError
from services.trainer.core import InvalidRequest, PreconditionError, TrainerCore, TrainerState
from services.trainer.settings import requested_sync_method
from services.trainer.weight_gather import FULL, FULL_ON_DEVICE
from services.weight_sync import (
    GroupInfo,
    TensorSpec,
    TransportOptions,
    WeightSyncError,
    specs_of,
    weights_digest,
)
from services.weight_sync.method import PushFn, Sender, SyncMethod
from services.weight_sync.transport import NcclTransport
from services.weight_sync.wire.group import resolve_backend

__all__ = ["Snapshot", "SyncResult", "WeightSync", "broadcasts_on_device"]


@dataclasses.dataclass(frozen=True)
class SyncResult:
    version: int
    step: int
    checkpoint_path: str
    seconds: float
    nbytes: int
    digest: str = ""


def broadcasts_on_device(backend: str, device: str) -> bool:
    """Whether a broadcast group of `backend` sends from the training `device` (NCCL on CUDA). A gloo
    group (a CPU trainer, or the one-GPU placement's same-device path) sends host tensors: on one host
    through /dev/shm, so the snapshot is gathered to the host once."""
    try:
        return resolve_backend(backend, torch.device(device)) == "nccl"
    except ValueError:  # nccl asked for on a CPU trainer: joining the group reports it
        return False


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The policy's weights after one step (private copies), taken before the next step changes them."""

    state: dict
    version: int
    step: int


class WeightSync:
    """Weight-sync state of one trainer: at most one broadcast group at a time."""

    def __init__(
        self,
        core: TrainerCore,
        *,
        method: SyncMethod | None = None,
        options: TransportOptions | None = None,
        push: PushFn | None = None,
        digest: bool = False,
    ):
        self.core = core
        self.digest = digest
        # the run's method, typed once in its settings record (TrainerSettings.sync_method)
        self.method = method if method is not None else core.settings.sync_method
        self.options = options or TransportOptions(checkpoint_dir=str(core.settings.job_dir / "state_dicts"))
        self.push = push
        self.nccl = NcclTransport(self.options)  # the broadcast group's, whatever the run's method
        self.generation = 0
        self.offered: GroupInfo | None = None
        self.joined: GroupInfo | None = None
        self._specs: tuple[TensorSpec, ...] | None = None

    def _ready(self) -> None:
        if self.core.state not in (TrainerState.READY, TrainerState.TRAINING):
            raise PreconditionError(
                f"trainer is {self.core.state.value}; weight sync needs a running trainer"
            )

    async def _gather(self) -> dict:
        async with self.core._lock:
            return dict(await asyncio.to_thread(lambda: dict(self.core.engine.iter_state_dict())))

    async def snapshot(self, method: SyncMethod | None = None) -> Snapshot:
        """The current weights (what `method` sends: the whole policy or a LoRA adapter) with their
        version and step, gathered under the core's lock (a step in flight finishes first), for a
        `sync` that may run while the next step trains. In the training compute dtype; a broadcast
        method's full policy stays on the training device (no host copy), the others get one host
        copy (`weight_gather`)."""
        m = method if method is not None else self.method
        kind = m.state_kind
        if m.broadcast and kind == FULL and self._broadcasts_on_device():
            kind = FULL_ON_DEVICE
        async with self.core._lock:
            state = dict(await asyncio.to_thread(lambda: dict(self.core.engine.iter_state_dict(kind))))
            return Snapshot(state, self.core.model_version, self.core.global_step)

    def _broadcasts_on_device(self) -> bool:
        info = self.joined or self.offered
        return broadcasts_on_device(
            info.backend if info is not None else self.options.backend, self.options.device
        )

    async def specs(self) -> tuple[TensorSpec, ...]:
        if self._specs is None:
            self._specs = tuple(specs_of(self.method.encode(await self._gather())))  # as broadcast
        return self._specs

    def abandon(self) -> None:
        """Make the broadcast in progress give up (the synchronizer called it off; any thread)."""
        if self.nccl.group is not None:
            self.nccl.group.abandon()

    async def get_info(self, receivers: int) -> GroupInfo:
        if receivers < 1:
            raise InvalidRequest("receivers", f"{receivers} must be >= 1")
        self._ready()
        specs = await self.specs()
        self.generation += 1
        self.offered = self.nccl.prepare(specs, world_size=receivers + 1, generation=self.generation)
        return self.offered

    async def setup(self, group: common_pb2.WeightSyncGroupInfo) -> int:
        self._ready()
        if self.offered is None:
            raise PreconditionError("call GetWeightSyncInfo before SetupWeightSyncGroup")
        try:
            info = GroupInfo.from_proto(group)
        except ValueError as exc:
            raise InvalidRequest("group", str(exc)) from exc
        if (info.generation, info.master_port) != (self.offered.generation, self.offered.master_port):
            raise PreconditionError(
                f"group generation {info.generation} port {info.master_port} is not the one offered "
                f"(generation {self.offered.generation} port {self.offered.master_port})"
            )
        await asyncio.to_thread(self.nccl.build_group, info, 0)
        self.joined = info
        return 0

    async def join(self, info: GroupInfo, rank: int = 0, abandon: threading.Event | None = None) -> int:
        """Join (as rank 0) a group instance handed out by the synchronizer, leaving the previous one
        (given up with `StaleGenerationError` once `abandon` is set)."""
        self._ready()
        if rank != 0:
            raise InvalidRequest("rank", f"the trainer sends from rank 0, got {rank}")
        self.joined = None
        await asyncio.to_thread(self.nccl.build_group, info, 0, abandon)
        self.joined = self.offered = info
        self.generation = max(self.generation, info.generation)
        return 0

    async def teardown(self, generation: int) -> None:
        if self.joined is None:
            raise PreconditionError("no weight-sync group to tear down")
        if generation and generation != self.joined.generation:
            raise PreconditionError(f"generation {generation} is not the joined {self.joined.generation}")
        await asyncio.to_thread(self.nccl.finalize)
        self.joined = None

    def requested(self, name: str) -> SyncMethod:
        """The method a SyncWeights request names, the run's when it names none."""
        if not name:
            return self.method
        try:
            return requested_sync_method(name)
        except (UnknownNameError, ImportError, TypeError) as exc:
            raise InvalidRequest("method", str(exc)) from exc

    async def sync(self, method: SyncMethod | None = None, snapshot: Snapshot | None = None) -> SyncResult:
        m = method if method is not None else self.method
        self._ready()
        sender = Sender(self.options, self.nccl if self.joined is not None else None, self.push)
        try:
            m.check_sender(sender)
        except WeightSyncError as exc:
            raise PreconditionError(str(exc)) from exc
        start = time.perf_counter()
        try:
            snap = snapshot or await self.snapshot(m)
        except ValueError as exc:  # e.g. an adapter-only method on a policy without LoRA
            raise PreconditionError(str(exc)) from exc
        state, version, step = snap.state, snap.version, snap.step
        try:
            delivery = await m.send(sender, version, step, state)
        except WeightSyncError as exc:
            raise PreconditionError(f"weight sync by {m.name} failed: {exc}") from exc
        seconds = time.perf_counter() - start
        digest = await asyncio.to_thread(weights_digest, m.as_received(state)) if self.digest else ""
        return SyncResult(version, step, delivery.path, seconds, m.wire_bytes(state), digest)

    async def close(self) -> None:
        if self.joined is not None:
            await asyncio.to_thread(self.nccl.finalize)
            self.joined = None
