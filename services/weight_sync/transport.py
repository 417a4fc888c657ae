"""One small interface over the three weight-sync methods, chosen by name (`synchronizer.sync_method`).

Lifecycle, the same for every method (after veRL's checkpoint engine):
    t = make_transport("nccl" | "memory" | "checkpoint", TransportOptions(...))
    info = t.prepare(specs, world_size, generation)  # sender: rendezvous to hand out (nccl), else None
    t.build_group(info, rank)                        # every member; nccl joins (rank 0 = sender)
    delivery = t.send(version, state_dict)           # sender; returns what receivers need
    load_weights(model, t.receive(delivery))         # each receiver, with the delivery it was handed
    t.finalize()                                     # teardown; build_group again for a new generation

`Delivery` is what crosses from sender to receivers through the synchronizer: for `nccl` only the
version (the bytes go through the group, and `receive` must run while rank 0 sends); for `memory`
the `rft.v1.WeightChunk`s (this module encodes and decodes in-process; the gRPC hop belongs to the
synchronizer service); for `checkpoint` the published file's path (`ModelVersion.checkpoint_path`).
There is one registry of methods (`SYNC_METHODS`, method.py): each method names its transport class
(`SyncMethod.transport`), and method.py's `make_transport(name)` looks the name (or alias) up
there (this module knows no method: method.py imports it, never the reverse).
`transport_options(config, ...)` is the one mapping from the run config to `TransportOptions`; its
`backend` is the resolved view's `weight_sync_backend` (gloo where the trainer and the explorer share
one GPU), the same one the synchronizer hands out in every `GroupInfo`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from rft.v1 import common_pb2

from services.common.config import RFTConfig, resolve
from services.weight_sync.errors import WeightSyncError
from services.weight_sync.wire.broadcast import BroadcastGroup
from services.weight_sync.wire.chunks import DEFAULT_CHUNK_BYTES, chunks_to_state_dict, state_dict_to_chunks
from services.weight_sync.wire.files import CheckpointStore, read_state_dict
from services.weight_sync.wire.group import DEFAULT_BUCKET_BYTES, GroupInfo, free_port
from services.weight_sync.wire.specs import TensorSpec

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class TransportOptions:
    """Settings of a transport; each method reads the fields it needs."""

    device: str = "cpu"  # nccl comm device (cuda:N -> nccl backend) and device of received tensors
    timeout_s: float = 3600.0  # synchronizer.sync_timeout
    bucket_bytes: int = DEFAULT_BUCKET_BYTES  # nccl
    backend: str = "auto"  # nccl: auto | nccl | gloo
    master_address: str = "127.0.0.1"  # nccl: address receivers reach rank 0 at
    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # memory
    checkpoint_dir: str | None = None  # checkpoint: the run's state-dict folder
    keep: int = 2  # checkpoint: versions kept on disk
    delta: bool = False  # checkpoint: also write each version's delta from the one before (delta_sync)


def transport_options(
    config: RFTConfig, *, device: str = "cpu", checkpoint_dir: str | None = None
) -> TransportOptions:
    """The options of a sender or receiver of `config`'s run on `device` (`checkpoint_dir`: the run's
    state-dict folder, for the checkpoint method)."""
    s = config.synchronizer
    return TransportOptions(
        device=device,
        timeout_s=s.sync_timeout,
        bucket_bytes=s.bucket_bytes,
        backend=resolve(config).weight_sync_backend,
        master_address=config.services.trainer.host,
        chunk_bytes=s.chunk_bytes,
        checkpoint_dir=checkpoint_dir,
        delta=s.delta_sync,
    )


@dataclass(frozen=True)
class Delivery:
    """One sent version, as the synchronizer hands it to each receiver."""

    version: int
    step: int = 0
    path: str = ""  # checkpoint
    chunks: tuple[common_pb2.WeightChunk, ...] = ()  # memory

    def model_version(self) -> common_pb2.ModelVersion:
        return common_pb2.ModelVersion(version=self.version, step=self.step, checkpoint_path=self.path)


@runtime_checkable
class WeightTransport(Protocol):
    name: str

    def prepare(
        self, specs: Sequence[TensorSpec], world_size: int = 2, generation: int = 0
    ) -> GroupInfo | None:
        """Sender side: the rendezvous receivers need (nccl), or None."""
        ...

    def build_group(self, info: GroupInfo | None, rank: int) -> None:
        """Join the transfer group as `rank` (0 = sender); rebuilds if `info.generation` changed."""
        ...

    def send(self, version: int, named_tensors: NamedTensors, step: int | None = None) -> Delivery: ...

    def receive(self, delivery: Delivery) -> Iterator[tuple[str, torch.Tensor]]: ...

    def finalize(self) -> None: ...


def _step(version: int, step: int | None) -> int:
    return version if step is None else step


class NcclTransport:
    """Broadcast through a stateless torch.distributed group (nccl on CUDA, gloo on CPU)."""

    name = "nccl"

    def __init__(self, options: TransportOptions):
        self.options = options
        self.group: BroadcastGroup | None = None

    def prepare(self, specs: Sequence[TensorSpec], world_size: int = 2, generation: int = 0) -> GroupInfo:
        o = self.options
        return GroupInfo(
            master_address=o.master_address,
            master_port=free_port(o.master_address),
            world_size=world_size,
            specs=tuple(specs),
            generation=generation,
            backend=o.backend,
            timeout_s=o.timeout_s,
            bucket_bytes=o.bucket_bytes,
        )

    def build_group(self, info: GroupInfo | None, rank: int, abandon: threading.Event | None = None) -> None:
        if info is None:
            raise WeightSyncError("the nccl method needs a GroupInfo (from the sender's prepare)")
        self.finalize()
        self.group = BroadcastGroup.join(info, rank, self.options.device, abandon)

    def _joined(self) -> BroadcastGroup:
        if self.group is None:
            raise WeightSyncError("build_group must be called before send/receive")
        return self.group

    def send(self, version: int, named_tensors: NamedTensors, step: int | None = None) -> Delivery:
        self._joined().send(version, named_tensors)
        return Delivery(version, _step(version, step))

    def receive(self, delivery: Delivery) -> Iterator[tuple[str, torch.Tensor]]:
        return self._joined().receive(delivery.version, self.options.device)

    def finalize(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


class _GrouplessTransport:
    """What the memory and checkpoint transports share: no group to prepare, build or finalize."""

    def __init__(self, options: TransportOptions):
        self.options = options

    def prepare(self, specs: Sequence[TensorSpec], world_size: int = 2, generation: int = 0) -> None:
        return None

    def build_group(self, info: GroupInfo | None, rank: int) -> None:
        return None

    def finalize(self) -> None:
        return None


def _state_dict(named_tensors: NamedTensors) -> Mapping[str, torch.Tensor]:
    return named_tensors if isinstance(named_tensors, Mapping) else dict(named_tensors)


class MemoryTransport(_GrouplessTransport):
    """Safetensors chunks in memory; the synchronizer streams them over gRPC."""

    name = "memory"

    def send(self, version: int, named_tensors: NamedTensors, step: int | None = None) -> Delivery:
        chunks = state_dict_to_chunks(
            _state_dict(named_tensors),
            version,
            step=_step(version, step),
            chunk_bytes=self.options.chunk_bytes,
        )
        return Delivery(version, _step(version, step), chunks=tuple(chunks))

    def receive(self, delivery: Delivery) -> Iterator[tuple[str, torch.Tensor]]:
        mv, sd = chunks_to_state_dict(delivery.chunks, self.options.device)
        if mv.version != delivery.version:
            raise WeightSyncError(f"chunks carry version {mv.version}, the delivery says {delivery.version}")
        return iter(sd.items())


class CheckpointTransport(_GrouplessTransport):
    """Safetensors files under `checkpoint_dir`, published atomically (wire/files.py)."""

    name = "checkpoint"

    def __init__(self, options: TransportOptions):
        if not options.checkpoint_dir:
            raise WeightSyncError("the checkpoint method needs TransportOptions.checkpoint_dir")
        super().__init__(options)
        self.store = CheckpointStore(options.checkpoint_dir, keep=options.keep)

    def send(self, version: int, named_tensors: NamedTensors, step: int | None = None) -> Delivery:
        path = self.store.save(version, _state_dict(named_tensors), delta=self.options.delta)
        return Delivery(version, _step(version, step), path=str(path))

    def receive(self, delivery: Delivery) -> Iterator[tuple[str, torch.Tensor]]:
        if delivery.path:
            return iter(read_state_dict(delivery.path, self.options.device).items())
        _, sd = self.store.load(delivery.version, self.options.device)
        return iter(sd.items())
