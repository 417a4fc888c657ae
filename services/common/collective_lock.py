"""One lock per device that serialises the collectives of different process groups issued from
different threads of one process.

Why: trainer rank 0 is a member of two groups on its GPU: the trainer's own (FSDP2 all-gathers and
reduce-scatters, issued from the thread that runs the engine call) and the weight-sync group
(`services.weight_sync.wire.broadcast.BroadcastGroup.send`, issued from another thread when the sync is pipelined:
`sync_offset` >= 1 sends step k's snapshot while step k+1 trains). NCCL allows several communicators
on one device only when their operations are issued in one consistent order; kernels of two
communicators launched concurrently from two threads can wait on each other for ever (NCCL's
"Using multiple NCCL communicators concurrently"). So every section that issues collectives on a
device - an engine call on the trainer (`FSDPEngine`), a broadcast send, the first all-reduce that
connects an NCCL weight-sync communicator (`services.weight_sync.wire.group`) - runs under `issuing_collectives(device)`:
while one is in flight, the others wait. On CUDA a section also synchronises its device before it
lets go, so none of its kernels is still running when the next section starts.

The rule holds by construction, whatever the backend: on the CPU (gloo, where concurrent groups are
safe) it costs the overlap of a short broadcast with a step, and the CPU tests exercise the very
code that runs on a GPU. It does not cost the point of pipelining: the explorers still generate the
next step while the trainer trains; only the trainer's own short send waits for the step's
collectives (or the step for the send). A gloo group that sends host tensors from a trainer on CUDA
(the one-GPU placement) keys its lock on the CPU, so it does not wait for the GPU's step.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["collective_lock", "issuing_collectives"]

_locks: dict[str, threading.RLock] = {}
_guard = threading.Lock()


def _key(device: str | torch.device) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return str(dev)


def collective_lock(device: str | torch.device) -> threading.RLock:
    """The process's lock for `device` (`cuda` means the current CUDA device); created on first use."""
    key = _key(device)
    with _guard:
        return _locks.setdefault(key, threading.RLock())


@contextlib.contextmanager
def issuing_collectives(device: str | torch.device) -> Iterator[None]:
    """Hold `device`'s lock while the body issues (and waits for) collectives; on CUDA the device is
    synchronised before the lock is released (not after a failure: its communicator is aborted or
    the error surfaces as it is)."""
    dev = torch.device(_key(device))
    with collective_lock(dev):
        yield
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
