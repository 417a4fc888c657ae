"""A stateless torch.distributed group for the `nccl` weight-sync method: trainer rank 0 + every rollout worker.

Why stateless: the trainer already runs a default process group (FSDP2 under torchrun) and an
explorer may run several engines in one process, so this group must neither need nor touch
`torch.distributed.init_process_group`. It is built from its own `TCPStore` (hosted by rank 0 on
`master_address:master_port` and listening there only, see `open_store`) wrapped in a `PrefixStore`
per generation, and a `ProcessGroupGloo` (CPU) or `ProcessGroupNCCL` (CUDA) object used directly - the
pattern of vLLM's RLHF weight-sync examples. Nothing is registered globally, so any number of groups
can come and go in one process.

`GroupInfo` mirrors `rft.v1.WeightSyncGroupInfo`, which the synchronizer hands to every member.
`generation` names one instance of the group: when an explorer joins or leaves, every member
`close()`s and joins again with generation + 1 (a fresh port from `free_port()` or the same one).
A member whose generation differs from rank 0's gets `StaleGenerationError`; a rank joined twice
gets `WeightSyncError`. Every wait is bounded by `timeout_s`: a member that dies or stalls makes the
others raise `GroupBrokenError`, never hang. A join also takes an `abandon` event, looked at every
0.5 s while it waits for the host or the other members (`member/superseded.py` sets it when the synchronizer
moves to a newer generation). A joined member's waits look at `Connection.abandon` once a second
(`member/superseded.py` sets it when the synchronizer calls the broadcast off: its sender was restarted or
a member is gone): the wait raises `StaleGenerationError` and the group is broken. A gloo collective
still pending then (its peer silent, as behind a connection whose close never arrived) keeps its
worker thread until the group's timeout, and destroying the process group would wait for it, so
such a group is let go in a daemon thread instead (`_park`). The transfer protocol itself is in
`broadcast.py`.

NCCL failure paths: NCCL's own defaults can hang or kill the process, so the nccl backend is built
so that every failure ends in `GroupBrokenError` within `timeout_s` instead (two members on one GPU
refused before NCCL starts, a non-blocking communicator connected eagerly, waits that abort the
communicator, the watchdog kept from ending the process). Why each is needed and what was measured:
docs/weight-sync.md, "NCCL failure paths".
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from rft.v1 import common_pb2

from services.common.collective_lock import issuing_collectives
from services.weight_sync.errors import GroupBrokenError, StaleGenerationError, WeightSyncError
from services.weight_sync.wire.specs import TensorSpec, specs_from_proto, specs_to_proto

DEFAULT_BUCKET_BYTES = 64 << 20
DEFAULT_GROUP_NAME = "rft_weight_sync"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class GroupInfo:
    """Rendezvous of one broadcast-group instance; mirrors `rft.v1.WeightSyncGroupInfo` 1:1.

    `backend`: `auto` (nccl when the member's device is CUDA, else gloo), `nccl` or `gloo`.
    `specs` is the transfer order; both ends plan buckets of `bucket_bytes` from it.
    """

    master_address: str
    master_port: int
    world_size: int
    specs: tuple[TensorSpec, ...] = ()
    generation: int = 0
    backend: str = "auto"
    timeout_s: float = 3600.0
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    group_name: str = DEFAULT_GROUP_NAME

    def __post_init__(self) -> None:
        object.__setattr__(self, "specs", tuple(self.specs))
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2 (one sender, one receiver), got {self.world_size}")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"backend {self.backend!r} is not one of auto, nccl, gloo")
        if self.timeout_s <= 0 or self.bucket_bytes <= 0:
            raise ValueError("timeout_s and bucket_bytes must be positive")

    def to_proto(self) -> common_pb2.WeightSyncGroupInfo:
        return common_pb2.WeightSyncGroupInfo(
            **{name: getattr(self, name) for name in (*_AS_THEY_ARE, *_ZERO_IS_DEFAULT)},
            timeout_s=max(1, round(self.timeout_s)),
            tensors=specs_to_proto(self.specs),
        )

    @classmethod
    def from_proto(cls, msg: common_pb2.WeightSyncGroupInfo) -> GroupInfo:
        return cls(
            **{name: getattr(msg, name) for name in _AS_THEY_ARE},
            **{name: value for name in _ZERO_IS_DEFAULT if (value := getattr(msg, name))},
            timeout_s=float(msg.timeout_s or 3600),
            specs=tuple(specs_from_proto(msg.tensors)),
        )


# How `WeightSyncGroupInfo` carries the fields: as they are, or as they are with proto3's zero (a field left
# unset) taking the default above; `timeout_s` in whole seconds (0: the default) and `specs` as `tensors`.
_AS_THEY_ARE = ("master_address", "master_port", "world_size", "generation")
_ZERO_IS_DEFAULT = ("backend", "bucket_bytes", "group_name")


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"backend nccl needs a CUDA device, got {device}")
    return backend


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (an IPv4/IPv6 address or a name), ready to hand to a TCPStore."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


JOIN_SLICE_S = 0.5  # a joining member looks at `abandon` at least this often
WAIT_SLICE_S = 1.0  # a joined member looks at `Connection.abandon` this often while a collective waits


def _check_abandon(abandon: threading.Event | None, info: GroupInfo, rank: int, doing: str) -> None:
    if abandon is not None and abandon.is_set():
        raise StaleGenerationError(
            f"rank {rank} gave up joining {info.group_name} generation {info.generation} while {doing}: "
            "the synchronizer moved to a newer generation"
        )


def _await_listener(info: GroupInfo, rank: int, deadline: float, abandon: threading.Event | None) -> None:
    """Wait (quietly: a plain TCP probe, not TCPStore's logged retries) until rank 0 hosts the store;
    past `deadline` the TCPStore connect that follows reports the failure."""
    while time.monotonic() < deadline:
        try:
            socket.create_connection((info.master_address, info.master_port), timeout=JOIN_SLICE_S).close()
            return
        except OSError:
            pass
        _check_abandon(abandon, info, rank, "connecting to its store")
        pause = min(JOIN_SLICE_S / 5, max(0.0, deadline - time.monotonic()))
        if abandon is not None:
            abandon.wait(pause)
        else:
            time.sleep(pause)  # ok-sleep: retry interval of a connect with a deadline


def _await_members(
    store, info: GroupInfo, rank: int, deadline: float, abandon: threading.Event | None
) -> None:
    """Wait until every rank has registered under `rank{r}` in `store` (bounded, abandonable)."""
    keys = [f"rank{r}" for r in range(info.world_size)]
    while True:
        try:
            store.wait(keys, timedelta(seconds=max(0.05, min(JOIN_SLICE_S, deadline - time.monotonic()))))
            return
        except RuntimeError as exc:  # DistStoreError on a timed-out wait; a dead host raises too
            if "timeout" not in str(exc).lower() or time.monotonic() >= deadline:
                raise
        _check_abandon(abandon, info, rank, "waiting for the other members")


def open_store(
    info: GroupInfo, rank: int, timeout: timedelta, abandon: threading.Event | None = None
) -> dist.TCPStore:
    """The group's TCPStore: rank 0 hosts it, the others connect to `master_address:master_port`.

    Rank 0 listens on `master_address` only. Given a port, TCPStore itself binds every interface
    (`::`) whatever host it is told, which would open an unauthenticated key-value store (and the
    rendezvous of the group) to the whole network; so rank 0 binds the socket here and hands it over
    (`master_listen_fd`, which the libuv server adopts and closes with the store).

    The others first wait until the host listens (plain TCP probes, up to `timeout`), giving up at once
    when `abandon` is set (the instance was superseded: its host may never come)."""
    common = {"world_size": info.world_size, "timeout": timeout, "wait_for_workers": False}
    if rank != 0:
        _await_listener(info, rank, time.monotonic() + timeout.total_seconds(), abandon)
        return dist.TCPStore(info.master_address, info.master_port, is_master=False, **common)
    sock = listening_socket(info.master_address, info.master_port)
    port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns (and closes) the descriptor from here on
    return dist.TCPStore(
        info.master_address, port, is_master=True, master_listen_fd=fd, use_libuv=True, **common
    )


SAME_DEVICE_ADVICE = (
    "two members of one NCCL group cannot share a GPU (NCCL: 'Duplicate GPU detected'); when the "
    "trainer and an explorer share a GPU, use the one-GPU placement's same-device path (backend "
    "gloo with every member on this host, which goes through shared memory) or "
    "synchronizer.sync_method: memory"
)
_WATCHDOG_SLACK = 2.0  # the NCCL watchdog's timeout is this many times the group's, plus a minute


def device_key(dev: torch.device) -> str:
    """`host|GPU uuid` of a CUDA device (what NCCL compares to detect a duplicate GPU); "" on CPU."""
    if dev.type != "cuda":
        return ""
    try:
        uuid = str(torch.cuda.get_device_properties(dev).uuid)
    except (RuntimeError, AttributeError, AssertionError):  # no uuid: leave the check to NCCL
        return ""
    return f"{socket.gethostname()}|{uuid}"


def check_distinct_devices(keys: list[str], rank: int, where: str) -> None:
    """Raise `GroupBrokenError` (with what to do instead) when two ranks name one GPU in `keys`."""
    seen: dict[str, int] = {}
    for r, key in enumerate(keys):
        if not key:
            continue
        if key in seen:
            raise GroupBrokenError(
                f"rank {rank} of {where}: ranks {seen[key]} and {r} are on the same GPU "
                f"({key.split('|', 1)[-1]} on {key.split('|', 1)[0]}); {SAME_DEVICE_ADVICE}"
            )
        seen[key] = r


@contextlib.contextmanager
def _nccl_env(timeout_s: float):
    """Environment read by `ProcessGroupNCCL`'s constructor: no process teardown on a timeout, and
    a bounded non-blocking init; values the user set are kept."""
    saved = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    if saved is None:
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"  # CleanUpOnly
    os.environ.setdefault("TORCH_NCCL_NONBLOCKING_TIMEOUT", str(max(1, round(timeout_s))))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)


def _park(pg, timeout_s: float) -> None:
    """Let go of a gloo group with a collective still pending: its destructor waits for that
    collective, which ends only at the group's timeout, so a daemon thread holds the last reference
    until then (and never delays the process's exit)."""

    def hold(group=pg) -> None:
        time.sleep(timeout_s + 60)  # ok-sleep: outlives the pending collective's own timeout
        del group

    threading.Thread(target=hold, name="weight-sync-abandoned-group", daemon=True).start()


def _abort(pg) -> None:
    with contextlib.suppress(Exception):  # an abort of a half-built communicator may itself fail
        pg.abort()


def _nccl_group(store, rank: int, info: GroupInfo, dev: torch.device, deadline: float, where: str):
    """A non-blocking `ProcessGroupNCCL`, connected (communicator built) before `deadline`, else
    aborted with `GroupBrokenError`; see the module docstring."""
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timedelta(seconds=info.timeout_s * _WATCHDOG_SLACK + 60)
    opts.config.blocking = 0
    with _nccl_env(info.timeout_s):
        pg = dist.ProcessGroupNCCL(store, rank, info.world_size, opts)
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            torch.cuda.set_device(dev)
            work = pg.allreduce([torch.ones(1, device=dev)], dist.AllreduceOptions())
            while not work.is_completed():
                if time.monotonic() > deadline:
                    raise TimeoutError("the first all-reduce did not complete")
                time.sleep(0.001)  # ok-sleep: polling a CUDA event up to a deadline
            work.wait()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            outcome.append(exc)

    thread = threading.Thread(target=connect, name=f"{info.group_name}-nccl-connect", daemon=True)
    with issuing_collectives(dev):  # no other group's collectives on this GPU meanwhile (collective_lock)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        if not (outcome and outcome[0] is None):
            _abort(pg)
            if not outcome:
                reason = f"the NCCL communicator was not built within {info.timeout_s:g}s (a member died or stalled)"
            else:
                reason = f"connecting NCCL failed: {outcome[0]}"
                if "duplicate gpu" in reason.lower():
                    reason += f"; {SAME_DEVICE_ADVICE}"
            raise GroupBrokenError(f"rank {rank} could not join {where}: {reason}")
    return pg


def _where(info: GroupInfo) -> str:
    return f"{info.group_name} generation {info.generation} at {info.master_address}:{info.master_port}"


def rendezvous(
    info: GroupInfo, rank: int, device: str = "", abandon: threading.Event | None = None
) -> tuple[dist.TCPStore, dist.PrefixStore]:
    """The store part of a join: open (rank 0: host) the store, check the generation, publish this
    member's `device_key` and register as `rank{rank}`. Returns the store and the instance's prefix
    store; the process group is built on the latter once every member registered."""
    store = open_store(info, rank, timedelta(seconds=info.timeout_s), abandon)
    gen_key = f"{info.group_name}/generation"
    if rank == 0:
        store.set(gen_key, str(info.generation))
    else:
        found = int(store.get(gen_key).decode())
        if found != info.generation:
            raise StaleGenerationError(
                f"member rank {rank} expects generation {info.generation} of {info.group_name} "
                f"but {info.master_address}:{info.master_port} hosts generation {found}"
            )
    prefix = dist.PrefixStore(f"{info.group_name}/g{info.generation}", store)
    prefix.set(f"device{rank}", device)  # before `rank{r}`: present once that is
    if prefix.add(f"rank{rank}", 1) != 1:
        raise WeightSyncError(f"rank {rank} joined {_where(info)} twice")
    return store, prefix


class Connection:
    """A joined group instance: the process-group object, this member's rank and the comm device.

    Build with `Connection.open(info, rank, device)`; use `BroadcastGroup` (broadcast.py) for
    transfers. After any failure `broken` is set and every later call raises `GroupBrokenError`.
    """

    def __init__(self, info: GroupInfo, rank: int, device: torch.device, backend: str, store, pg):
        self.info, self.rank, self.device, self.backend = info, rank, device, backend
        self._store, self._pg = store, pg
        self.broken: str | None = None
        self.abandon = threading.Event()  # set: the synchronizer called the broadcast off; waits give up
        self._abandoned = False  # a wait gave up with a collective still pending

    @classmethod
    def open(
        cls,
        info: GroupInfo,
        rank: int,
        device: str | torch.device = "cpu",
        abandon: threading.Event | None = None,
    ) -> Connection:
        """Join as `rank`: the store, then a wait until every member arrived (bounded by the group's
        timeout; given `abandon`, given up with `StaleGenerationError` once it is set), then the
        process group (fast once everyone is there)."""
        if not 0 <= rank < info.world_size:
            raise ValueError(f"rank {rank} is outside world_size {info.world_size}")
        dev = torch.device(device)
        backend = resolve_backend(info.backend, dev)
        if backend == "nccl":
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(dev)
        else:
            dev = torch.device("cpu")
        timeout = timedelta(seconds=info.timeout_s)
        where = _where(info)
        deadline = time.monotonic() + info.timeout_s
        try:
            store, prefix = rendezvous(info, rank, device_key(dev), abandon)
            _await_members(prefix, info, rank, deadline, abandon)
            if backend == "nccl":
                keys = [prefix.get(f"device{r}").decode() for r in range(info.world_size)]
                check_distinct_devices(keys, rank, where)
                pg = _nccl_group(prefix, rank, info, dev, deadline, where)
            else:
                pg = dist.ProcessGroupGloo(prefix, rank, info.world_size, timeout)
        except WeightSyncError:
            raise
        except (RuntimeError, ValueError, OSError) as exc:  # DistStoreError / DistNetworkError: RuntimeErrors
            raise GroupBrokenError(
                f"rank {rank} could not join {where} within {info.timeout_s:g}s: {exc}"
            ) from exc
        return cls(info, rank, dev, backend, store, pg)

    @property
    def pg(self):
        if self.broken is not None:
            raise GroupBrokenError(
                f"{self.describe()} is broken ({self.broken}); rebuild it with a new generation"
            )
        if self._pg is None:
            raise WeightSyncError(f"{self.describe()} is closed")
        return self._pg

    def describe(self) -> str:
        i = self.info
        return f"weight-sync group {i.group_name} gen {i.generation} ({self.backend}, rank {self.rank}/{i.world_size})"

    def wait(self, work, what: str) -> None:
        """Wait for one collective; any failure marks the group broken and raises `GroupBrokenError`.

        nccl: the work is polled up to `timeout_s`, then the communicator is aborted (its kernels
        stop) before the error is raised, so neither a hang nor torch's watchdog ends the process.
        gloo: waited for in slices of `WAIT_SLICE_S` (a timed-out slice leaves the work running).
        Both give up with `StaleGenerationError` once `abandon` is set."""
        try:
            if self.backend == "nccl":
                self._poll(work)
                work.wait()  # completed: orders the caller's stream after it, raises its error
            else:
                self._wait_gloo(work)
        except StaleGenerationError as exc:
            self._abandoned = True
            self.fail(f"{what} given up: {exc}")
            if self.backend == "nccl" and self._pg is not None:
                _abort(self._pg)
            raise StaleGenerationError(f"{self.describe()}: {what} given up: {exc}") from None
        except Exception as exc:  # gloo raises RuntimeError/DistBackendError with varied messages
            raise self._broken(exc, what) from exc

    def _wait_gloo(self, work) -> None:
        deadline = time.monotonic() + self.info.timeout_s
        while True:
            try:
                work.wait(timedelta(seconds=max(0.001, min(WAIT_SLICE_S, deadline - time.monotonic()))))
                return
            except Exception:
                if work.is_completed():  # done as the slice ended: returns, or raises its own error
                    work.wait()
                    return
                if time.monotonic() >= deadline:
                    raise  # the group's whole timeout
            self._check_abandon()

    def _check_abandon(self) -> None:
        if self.abandon.is_set():
            raise StaleGenerationError(
                "the synchronizer called this broadcast off (its sender or a member is gone)"
            )

    def launch(self, start, what: str):
        """`start(pg)` (a collective's launch; returns its work), with a failure turned into
        `GroupBrokenError` as in `wait` (a non-blocking NCCL launch can fail or time out itself)."""
        pg = self.pg
        try:
            return start(pg)
        except Exception as exc:  # DistBackendError, RuntimeError
            raise self._broken(exc, what) from exc

    def _broken(self, exc: Exception, what: str) -> GroupBrokenError:
        self.fail(f"{what} failed: {exc}")
        if self.backend == "nccl" and self._pg is not None:
            _abort(self._pg)
        return GroupBrokenError(
            f"{self.describe()}: {what} failed (a member died, stalled past {self.info.timeout_s:g}s "
            f"or aborted): {exc}"
        )

    def _poll(self, work) -> None:
        deadline = time.monotonic() + self.info.timeout_s
        pause = 50e-6
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not completed within {self.info.timeout_s:g}s")
            self._check_abandon()
            time.sleep(pause)  # ok-sleep: polling a CUDA event up to a deadline
            pause = min(pause * 2, 0.005)

    def fail(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason

    def close(self) -> None:
        """Leave the group (idempotent). Rank 0 also stops hosting the store."""
        pg, self._pg, self._store = self._pg, None, None
        if pg is not None and self._abandoned and self.backend != "nccl":
            _park(pg, self.info.timeout_s)
        elif pg is not None:
            try:
                if self.broken is not None and hasattr(pg, "abort"):
                    pg.abort()
                else:
                    pg.shutdown()
            except Exception:  # noqa: BLE001 - teardown of a dead group must not mask the real error
                pass
