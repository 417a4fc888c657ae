"""Process-group set-up and the rank-0 -> workers command channel.

Under `torchrun` every rank joins the default group from the environment (`RANK`, `WORLD_SIZE`,
`MASTER_ADDR`, `MASTER_PORT`).  Without torchrun the process makes a group of one on a free
loopback port, so FSDP2 and every collective run the same code path with world size 1.  Backend
(`backend_for`): `cpu:gloo,cuda:nccl` on CUDA, as veRL does, so a CPU tensor (the float64 metric
sums of actor and critic, the pickled objects of `all_gather_object`) goes over gloo and a CUDA
tensor over NCCL in the same group; gloo alone on CPU.

Rank 0 hosts gRPC and decides what happens; the other ranks sit in `worker_loop` and execute the
same engine method when rank 0 broadcasts a small `Command` (name + picklable payload).  The
payload travels between ranks of one job only (never from a file or the network outside it).
Commands go over the channel's own gloo group, not the default group: a worker rank may wait
there as long as rank 0 likes (slow first rollouts, an explorer restart, a long weight-sync join)
without meeting the default group's timeout or NCCL's watchdog, and it still learns at once when
rank 0 dies, because gloo raises as soon as the peer's connection closes.

Each command a rank executes is a unit of work (services/common/progress.py, "trainer train_step"):
a rank blocked in one of its collectives because a peer is stopped is found by its progress, not by a
collective.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from services.common import progress

__all__ = [
    "COMMAND_TIMEOUT",
    "Command",
    "CommandChannel",
    "DistInfo",
    "backend_for",
    "device_for_rank",
    "ensure_process_group",
    "leave_process_group",
    "free_port",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def device_for_rank(local_rank: int) -> torch.device:
    """`cuda:<local_rank>` when CUDA is available, else CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """The default group's backend for ranks on `device`.

    On CUDA every collective names its device: CUDA tensors go over NCCL, CPU tensors (metric sums,
    object collectives) over gloo, in one group.  An NCCL-only group would refuse the CPU ones ("No
    backend type associated with device type cpu").
    """
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def ensure_process_group(timeout_s: float = 1800.0) -> DistInfo:
    """Join (or create) the default process group and describe this rank.

    `timeout_s` bounds each collective of the default group (every rank is busy in the same command
    then); idle worker ranks wait on the command channel's group instead (`COMMAND_TIMEOUT`).
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = device_for_rank(local_rank)
    backend = backend_for(device)
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        else:
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://127.0.0.1:{free_port()}",
                rank=0,
                world_size=1,
                timeout=timedelta(seconds=timeout_s),
            )
    return DistInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        backend=dist.get_backend(),
        device=device,
    )


def leave_process_group(info: DistInfo) -> None:
    """Ranks of a multi-process group: destroy it before exiting.

    A gloo group still alive at interpreter exit can abort the process ("terminate called without an
    active exception") while its threads are torn down; a world of one is left for reuse.
    """
    if info.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int = 0) -> NoReturn:
    """End a rank's process now, its work done and its group left (`leave_process_group`).

    Sharded parameters still reference the destroyed group; torn down during interpreter finalization,
    with gloo's threads, they can abort a process that finished its work ("terminate called without an
    active exception", SIGABRT). Flushing the output and leaving with `os._exit` skips that teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclasses.dataclass(frozen=True)
class Command:
    """One unit of work every rank executes together: `handler(name)(payload)`."""

    name: str
    payload: Any = None


STOP = "stop"

# How long a worker rank may wait for rank 0's next command.  Rank 0 may go quiet for hours (no
# experiences yet, an explorer restarting, a weight-sync group waiting for its members) and the workers
# must outlast that; they do not need the timeout to notice rank 0 dying (its connections close).
# Kept under 2**31 ms (24.8 days), so no layer that holds milliseconds in a 32-bit int can wrap it.
COMMAND_TIMEOUT = timedelta(days=24)


class CommandChannel:
    """Rank 0 broadcasts commands; ranks > 0 run them in `worker_loop` until `stop`.

    With several ranks, constructing the channel is collective: every rank creates its gloo group
    (`group`) at set-up, in the same order as its other groups.  Commands travel over it as pickled
    CPU objects.  With world size 1 there is no group and `run` just calls the handler.
    """

    def __init__(
        self,
        info: DistInfo,
        handlers: dict[str, Callable[[Any], Any]],
        timeout: timedelta = COMMAND_TIMEOUT,
    ):
        self.info = info
        self.handlers = handlers
        self.group: dist.ProcessGroup | None = None
        if info.world_size > 1:
            self.group = dist.new_group(backend="gloo", timeout=timeout)

    def _broadcast(self, command: Command | None) -> Command:
        box: list[Any] = [command]
        dist.broadcast_object_list(box, src=0, group=self.group, device=torch.device("cpu"))
        return box[0]

    def run(self, name: str, payload: Any = None) -> Any:
        """On rank 0: make every rank execute `name(payload)`; returns rank 0's result."""
        if not self.info.is_main:
            raise RuntimeError("only rank 0 issues commands")
        if name == STOP:
            if self.info.world_size > 1:
                self._broadcast(Command(name, payload))
            return None
        with progress.work(f"trainer {name}"):  # rank 0's part, the broadcast to the others included
            if self.info.world_size > 1:
                self._broadcast(Command(name, payload))
            return self.handlers[name](payload)

    def stop_workers(self) -> None:
        if self.info.world_size > 1:
            self._broadcast(Command(STOP))

    def worker_loop(self) -> None:
        """On ranks > 0: execute broadcast commands until rank 0 sends `stop`.

        Raises (gloo's error) when rank 0's process ends without sending `stop`.
        """
        while True:
            command = self._broadcast(None)
            if command.name == STOP:
                return
            with progress.work(f"trainer {command.name}"):  # reported by this rank's RankBeacon
                self.handlers[command.name](command.payload)
