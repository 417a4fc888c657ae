"""Bucketed broadcast of named tensors from rank 0 to every receiver of a `Connection` (the nccl method).

One `send` is, in order:
1. a header broadcast (int64: magic, generation, version, spec fingerprint, bucket count, status), so
   a receiver with other metadata or generation fails at once and the sender can abort cleanly;
2. one broadcast per bucket (`buckets.py`); the sender packs bucket k+1 while bucket k is in flight,
   and a receiver posts bucket k+1 before handing out the tensors of bucket k (double buffering);
3. an all-reduce(MIN) acknowledgement: each receiver says whether it consumed every tensor, so the
   sender returns only after all receivers hold the whole version, and learns if one failed.
The whole send holds its device's `issuing_collectives` lock (`services.common.collective_lock`): on
trainer rank 0 it never runs beside the training step's collectives, which another thread issues.

When every member is on one host (the group's address is a loopback one) and the tensors are on the
CPU, step 2 goes through shared memory instead: the sender packs every bucket into one file under
/dev/shm (named after the group's port and generation), broadcasts a one-number "ready", and each
receiver reads its views straight from the mapped file. One copy in, one copy out per receiver, all
receivers in parallel, instead of one TCP transfer per receiver. The header says which way a send
goes, so members never disagree; the acknowledgement keeps the sender from overwriting the file
before every receiver is done with it. The sender removes the file when the group closes or its
process exits (a killed sender leaves it behind). Any size goes this way that /dev/shm has room for
(its free space against the file plus a margin, `shm_shortfall`); where it has not, the send goes over
the network broadcast and the sender logs why once. `RFT_WEIGHT_SYNC_SHM=0` turns this off.

The sender takes each tensor where it is: the trainer's gather (`services/trainer/weight_gather.py`)
leaves the weights on its GPU in the training dtype, so on nccl they are packed into the GPU bucket
buffers (two of `bucket_bytes`) and broadcast with no host copy; a larger-than-bucket tensor goes
from its own storage. Every wait is `Connection.wait` (bounded by `timeout_s`; on nccl the
communicator is aborted before `GroupBrokenError` is raised).

Receivers get `(name, tensor)` pairs in spec order, on the device they asked for; on the comm device
the tensors are views into the received bucket (copy them or load them; `load_weights` copies).
`receive` is a generator: consume it fully or close it - closing early drains the remaining buckets
and acknowledges failure, so the other members never hang. `abandon()` (from any thread) makes the
send or receive in progress give up with `StaleGenerationError` within a second: the synchronizer
called the broadcast off, so nothing more will come (`superseded.broadcast_unless_called_off`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from services.common.collective_lock import issuing_collectives
from services.common.log import get_logger
from services.weight_sync.errors import GroupBrokenError, WeightSyncError
from services.weight_sync.wire.buckets import Bucket, pack, plan_buckets, unpack
from services.weight_sync.wire.group import Connection, GroupInfo
from services.weight_sync.wire.specs import TensorSpec, fingerprint

_MAGIC = 0x5246544D  # "RFTM"
_OK, _ABORT = 1, 0
_SHM_DIR = "/dev/shm"
_ALIGN = 64
_shm_fallback_logged = False  # the reason /dev/shm could not hold a send is logged once per process

log = get_logger("weight_sync.broadcast")


def shm_margin(payload: int) -> int:
    """Room left free beside a payload in /dev/shm (tmpfs is RAM others use): 1/16 of it + 16 MiB."""
    return payload // 16 + (16 << 20)


def shm_shortfall(
    payload: int, statvfs: Callable[[str], os.statvfs_result] = os.statvfs, path: str = _SHM_DIR
) -> str | None:
    """Why `path` (a tmpfs) cannot hold `payload` bytes plus `shm_margin`; None when it can. `statvfs`
    is `os.statvfs` (a stand-in in tests)."""
    try:
        st = statvfs(path)
    except OSError as e:
        return f"{path} cannot be read ({e})"
    free = st.f_bavail * st.f_frsize
    need = payload + shm_margin(payload)
    if free < need:
        return (
            f"{path} has {free / 2**30:.2f} GiB free, a send needs {need / 2**30:.2f} GiB "
            f"({payload / 2**30:.2f} GiB of weights + margin); give the container more shared memory "
            "(docker --shm-size, a memory-backed emptyDir on /dev/shm in Kubernetes)"
        )
    return None


def _loopback(address: str) -> bool:
    return address in ("localhost", "::1") or address.startswith("127.")


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@dataclass(frozen=True)
class SendStats:
    version: int
    buckets: int
    nbytes: int
    seconds: float


class BroadcastGroup:
    """One member of a weight-broadcast group instance. Rank 0 sends; every other rank receives.

    >>> group = BroadcastGroup.join(info, rank=0)              # trainer
    >>> group.send(version, state_dict)                        # returns once all receivers acked
    >>> group = BroadcastGroup.join(info, rank=r, device="cuda:0")  # each rollout worker
    >>> load_weights(model, group.receive(version))
    >>> group.close()                                          # teardown; join again with generation+1
    """

    def __init__(self, conn: Connection):
        self._conn = conn
        self.info: GroupInfo = conn.info
        self.specs: tuple[TensorSpec, ...] = conn.info.specs
        self._plan: list[Bucket] = plan_buckets(self.specs, conn.info.bucket_bytes)
        self._fp = fingerprint(self.specs)
        self._bufs: list[torch.Tensor] = []
        self._offsets: list[int] = []  # each bucket's place in the shared-memory file
        end = _ALIGN  # the first bytes hold the sender's stamp for the send
        for bucket in self._plan:
            self._offsets.append(end)
            end += -(-bucket.nbytes // _ALIGN) * _ALIGN
        self._shm_bytes = end
        self._shm: torch.Tensor | None = None
        name = f"rft-wsync-{self.info.group_name}-{self.info.master_port}-g{self.generation}"
        self._shm_path = os.path.join(_SHM_DIR, name)
        self._shm_owner: weakref.finalize | None = None  # the sender removes its file (also at exit)

    @classmethod
    def join(
        cls,
        info: GroupInfo,
        rank: int,
        device: str | torch.device = "cpu",
        abandon: threading.Event | None = None,
    ) -> BroadcastGroup:
        """Join (rank 0: host) the group; blocks until all `world_size` members arrived or `timeout_s`
        (or `abandon` is set: `StaleGenerationError`)."""
        return cls(Connection.open(info, rank, device, abandon))

    @property
    def rank(self) -> int:
        return self._conn.rank

    @property
    def generation(self) -> int:
        return self.info.generation

    @property
    def broken(self) -> bool:
        return self._conn.broken is not None

    def __enter__(self) -> BroadcastGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def abandon(self) -> None:
        """Make the send or receive in progress give up at its next look (`StaleGenerationError`;
        any thread may call it). The next send or receive starts with the flag cleared."""
        self._conn.abandon.set()

    def close(self) -> None:
        self._bufs = []
        self._shm = None
        if self._shm_owner is not None:
            self._shm_owner()
        self._conn.close()

    # ---- shared memory -------------------------------------------------------------------------
    def _shm_usable(self) -> bool:
        """Sender's choice for one send: same host, CPU tensors, and a /dev/shm that holds the model
        (its file, once made, holds its room; else the free space is checked, `shm_shortfall`)."""
        global _shm_fallback_logged
        if not (
            os.environ.get("RFT_WEIGHT_SYNC_SHM", "1") != "0"
            and self._conn.device.type == "cpu"
            and _loopback(self.info.master_address)
            and self._shm_bytes > 0
            and os.path.isdir(_SHM_DIR)
        ):
            return False
        if self._shm is not None:
            return True
        why = shm_shortfall(self._shm_bytes)
        if why is not None and not _shm_fallback_logged:
            _shm_fallback_logged = True
            log.warning("weight sync over the network broadcast, not /dev/shm", reason=why)
        return why is None

    def _region(self) -> torch.Tensor:
        """The mapped file (created by the sender on first use, sized for every bucket)."""
        if self._shm is None:
            if self.rank == 0:
                self._shm_owner = weakref.finalize(self, _unlink, self._shm_path)
            elif not os.path.exists(self._shm_path):
                raise WeightSyncError(
                    f"{self._conn.describe()}: the sender's shared-memory file {self._shm_path} is not "
                    "visible here (another /dev/shm?); set RFT_WEIGHT_SYNC_SHM=0 on the sender"
                )
            self._shm = torch.from_file(self._shm_path, shared=True, size=self._shm_bytes, dtype=torch.uint8)
        return self._shm

    # ---- collectives -------------------------------------------------------------------------
    def _bcast(self, tensor: torch.Tensor, what: str = "broadcast"):
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self._conn.launch(lambda pg: pg.broadcast([tensor], opts), what)

    def _header(self, version: int, status: int, via_shm: bool = False) -> torch.Tensor:
        vals = [_MAGIC, self.generation, version, self._fp, len(self._plan), status, int(via_shm)]
        return torch.tensor(vals, dtype=torch.int64, device=self._conn.device)

    def _ack(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=self._conn.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        work = self._conn.launch(lambda pg: pg.allreduce([flag], opts), "acknowledgement")
        self._conn.wait(work, "acknowledgement")
        return bool(flag.item() == 1)

    def _buffer(self, slot: int) -> torch.Tensor:
        if not self._bufs:
            size = max((b.nbytes for b in self._plan if not b.solo), default=0)
            self._bufs = [torch.empty(size, dtype=torch.uint8, device=self._conn.device) for _ in range(2)]
        return self._bufs[slot]

    # ---- sender ------------------------------------------------------------------------------
    def send(
        self, version: int, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> SendStats:
        """Broadcast one version (rank 0 only). Tensors are matched to the specs by name; extra names
        are ignored, missing ones or a dtype/shape mismatch abort the send (receivers raise too)."""
        if self.rank != 0:
            raise WeightSyncError(f"rank {self.rank} cannot send; only rank 0 broadcasts")
        with issuing_collectives(self._conn.device):  # never beside another group's (collective_lock)
            return self._send(version, named_tensors)

    def _send(
        self, version: int, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> SendStats:
        start = time.perf_counter()
        self._conn.abandon.clear()
        table = dict(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        problems = [f"{s.name} missing" for s in self.specs if s.name not in table]
        problems += [
            f"{s.name}: got {table[s.name].dtype}{list(table[s.name].shape)}, spec {s}"
            for s in self.specs
            if s.name in table and not s.matches(table[s.name])
        ]
        conn = self._conn
        if problems:
            conn.wait(self._bcast(self._header(version, _ABORT)), "header")
            raise WeightSyncError(
                f"version {version} does not match the group's tensor specs: {'; '.join(problems[:5])}"
            )
        via_shm = self._shm_usable()
        conn.wait(self._bcast(self._header(version, _OK, via_shm)), "header")
        work, nbytes = None, 0
        if via_shm:
            region = self._region()
            for bucket, offset in zip(self._plan, self._offsets, strict=True):
                if bucket.nbytes == 0:
                    continue
                dest = region[offset : offset + bucket.nbytes]
                flat = pack(bucket, [table[s.spec.name] for s in bucket.slots], dest)
                if flat.data_ptr() != dest.data_ptr():  # a solo bucket hands back the tensor itself
                    dest.copy_(flat)
                nbytes += bucket.nbytes
            # a fresh stamp in the file and in the "ready" message: a receiver that maps another file
            # (another /dev/shm behind the same loopback address) sees the mismatch instead of zeros
            stamp = torch.randint(1, 2**62, (1,), dtype=torch.int64)
            region[:8].copy_(stamp.view(torch.uint8))
            conn.wait(self._bcast(stamp.to(conn.device)), "shared-memory ready")
        for k, bucket in enumerate(() if via_shm else self._plan):
            if bucket.nbytes == 0:
                continue
            tensors = [table[s.spec.name].to(conn.device, non_blocking=True) for s in bucket.slots]
            flat = pack(bucket, tensors, self._buffer(k % 2))
            nbytes += bucket.nbytes
            nxt = self._bcast(flat)
            if work is not None:
                conn.wait(work, "bucket broadcast")
            work = nxt
        if work is not None:
            conn.wait(work, "bucket broadcast")
        if not self._ack(True):
            raise WeightSyncError(f"{conn.describe()}: a receiver failed to consume version {version}")
        return SendStats(version, len(self._plan), nbytes, time.perf_counter() - start)

    # ---- receiver ----------------------------------------------------------------------------
    def receive(
        self, version: int | None = None, device: str | torch.device | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Wait for rank 0's next send and return an iterator of `(name, tensor)` in spec order.

        Rank > 0 only. The header is received here (so an abort or a mismatch raises at once); the
        buckets arrive as the iterator is consumed. `version`, when given, must equal the sender's;
        `device` defaults to the comm device.
        """
        if self.rank == 0:
            raise WeightSyncError("rank 0 is the sender; it cannot receive")
        conn = self._conn
        conn.abandon.clear()
        out_device = torch.device(device) if device is not None else conn.device
        header = self._header(-1, _OK)
        conn.wait(self._bcast(header), "header")
        magic, gen, sent_version, fp, n_buckets, status, via_shm = header.tolist()
        if status != _OK:
            raise WeightSyncError(
                f"{conn.describe()}: the sender aborted version {sent_version} (see its log)"
            )
        mismatch = None
        if magic != _MAGIC or gen != self.generation:
            mismatch = f"header magic/generation {magic:#x}/{gen} != {_MAGIC:#x}/{self.generation}"
        elif fp != self._fp or n_buckets != len(self._plan):
            mismatch = "the sender's tensor specs differ from this member's"
        elif version is not None and sent_version != version:
            mismatch = f"expected version {version}, the sender sends {sent_version}"
        if mismatch:
            conn.fail(mismatch)
            self.close()  # peers see the connection drop instead of waiting for the timeout
            raise GroupBrokenError(f"{conn.describe()}: {mismatch}")
        if via_shm:
            stamp = torch.zeros(1, dtype=torch.int64, device=conn.device)
            conn.wait(self._bcast(stamp), "shared-memory ready")
            return self._receive_shared(out_device, int(stamp.item()))
        return self._receive_buckets(out_device)

    def _receive_shared(self, out_device: torch.device, stamp: int) -> Iterator[tuple[str, torch.Tensor]]:
        done = False
        try:
            region = self._region()
            if int(region[:8].view(torch.int64)[0]) != stamp:
                raise WeightSyncError(
                    f"{self._conn.describe()}: {self._shm_path} does not hold this send (another "
                    "/dev/shm behind the same address?); set RFT_WEIGHT_SYNC_SHM=0 on the sender"
                )
            for bucket, offset in zip(self._plan, self._offsets, strict=True):
                for name, tensor in unpack(bucket, region[offset : offset + bucket.nbytes]):
                    yield name, tensor if tensor.device == out_device else tensor.to(out_device)
            done = True
        finally:
            if not self.broken:
                self._ack(done)

    def _post(self, k: int):
        bucket = self._plan[k]
        flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=self._conn.device)
        return bucket, flat, (self._bcast(flat) if bucket.nbytes else None)

    def _receive_buckets(self, out_device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
        conn, n = self._conn, len(self._plan)
        pending = self._post(0) if n else None
        k, done = 0, False
        try:
            while pending is not None:
                bucket, flat, work = pending
                if work is not None:
                    conn.wait(work, "bucket broadcast")
                pending = self._post(k + 1) if k + 1 < n else None
                k += 1
                for name, tensor in unpack(bucket, flat):
                    yield name, tensor if tensor.device == out_device else tensor.to(out_device)
            done = True
        finally:
            if not self.broken:
                if not done:  # consumer stopped early: keep the collectives aligned, then say so
                    while pending is not None:
                        if pending[2] is not None:
                            conn.wait(pending[2], "bucket broadcast")
                        pending = self._post(k + 1) if k + 1 < n else None
                        k += 1
                self._ack(done)
