"""Rank processes for the trainer's process-group tests: the default group and the command channel.

Each function is the body of one spawned rank (`RANK`/`WORLD_SIZE` set as torchrun would).  Ranks
report to the test over a multiprocessing queue as `(what, rank, ...)` tuples, so a test waits on
messages and process exits with deadlines, never on sleeps.  A rank flushes its messages and ends
with `exit_rank`, which skips the gloo teardown at interpreter exit.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

WORKER_FAILED = 3  # exit code of a worker rank whose `worker_loop` raised


def _exit(queue: Any, code: int) -> None:
    """Flush this rank's messages (the queue's feeder thread), then `exit_rank`."""
    from services.trainer.distributed import exit_rank

    queue.close()
    queue.join_thread()
    exit_rank(code)


def _join_env(rank: int, world: int, port: int, local_rank: int) -> None:
    from tests.support.rank_env import set_rank_env

    set_rank_env(rank, world, port, local_rank)


def channel_rank(
    rank: int, world: int, port: int, scenario: str, default_timeout_s: float, queue: Any, start: Any
) -> None:
    """CPU rank of the command-channel scenarios.

    Both scenarios: rank 0 runs `record(1)` on every rank.  `idle`: rank 0 then stays idle for twice
    the default group's timeout, runs `record(2)` and stops the workers.  `die`: rank 0 reports
    `ready` and waits to be killed.  A worker reports `stopped` with what it recorded, or `raised`
    with the error that ended its `worker_loop`.
    """
    _join_env(rank, world, port, rank)
    torch.set_num_threads(1)
    import torch.distributed as dist

    from services.trainer.distributed import CommandChannel, ensure_process_group, leave_process_group

    start.wait(timeout=120)  # every rank has imported torch: a short default timeout covers only the set-up
    info = ensure_process_group(timeout_s=default_timeout_s)
    recorded: list[Any] = []

    def record(value: Any) -> None:
        recorded.append(value)
        queue.put(("ran", rank, value))

    channel = CommandChannel(info, {"record": record})
    if rank:
        try:
            channel.worker_loop()
        except Exception as exc:  # the test asserts which error ended the loop
            queue.put(("raised", rank, type(exc).__name__, str(exc)[:500]))
            _exit(queue, WORKER_FAILED)
        queue.put(("stopped", rank, recorded))
        leave_process_group(info)
        _exit(queue, 0)
    group = getattr(channel, "group", None)
    queue.put(("group", rank, dist.get_backend(group) if group is not None else None, group is not None))
    channel.run("record", 1)
    if scenario == "die":
        queue.put(("ready", rank))
        threading.Event().wait()  # until the test kills this process
    time.sleep(2 * default_timeout_s)  # a deliberate idle period, longer than the default group's timeout
    channel.run("record", 2)
    channel.stop_workers()
    leave_process_group(info)
    _exit(queue, 0)


def cuda_rank(rank: int, world: int, port: int, queue: Any) -> None:
    """GPU rank: the default group `ensure_process_group` makes on CUDA, and the command channel.

    Reports `("checks", rank, dict)`.  A CUDA all-reduce runs only when every rank has a GPU of its
    own (two ranks never share an NCCL communicator on one GPU); the CPU collectives, the object
    collective and the channel run in every case.
    """
    own_gpu = world <= torch.cuda.device_count()
    if world > 1:
        _join_env(rank, world, port, rank % torch.cuda.device_count())
    import torch.distributed as dist

    from services.trainer.distributed import CommandChannel, ensure_process_group, leave_process_group

    info = ensure_process_group()
    out: dict[str, Any] = {
        "backend": dist.get_backend(),
        "info_backend": info.backend,
        "device": str(info.device),
    }
    sums = torch.full((3,), rank + 1.0, dtype=torch.float64)  # as actor / critic reduce their metrics
    dist.all_reduce(sums)
    out["cpu_sum"] = sums.tolist()
    if own_gpu:
        x = torch.full((4,), rank + 1.0, dtype=torch.bfloat16, device=info.device)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        out["cuda_sum"] = x.float().cpu().tolist()
        out["cuda_device"] = str(x.device)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank})  # as actor / rowwise gather their objects
    out["gathered"] = gathered

    def report(payload: torch.Tensor) -> dict[str, Any]:
        seen = {"payload": payload.tolist(), "payload_device": str(payload.device)}
        if rank:
            queue.put(("worker", rank, seen))
        return seen

    channel = CommandChannel(info, {"report": report})
    out["channel_backend"] = dist.get_backend(channel.group) if channel.group is not None else None
    if rank:
        channel.worker_loop()
        queue.put(("checks", rank, out))
        leave_process_group(info)
        _exit(queue, 0)
    out["ran"] = channel.run("report", torch.arange(3, dtype=torch.float64))
    channel.stop_workers()
    queue.put(("checks", rank, out))
    leave_process_group(info)
    _exit(queue, 0)
