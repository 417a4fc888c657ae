"""Worker processes for the weight-sync broadcast tests: each runs commands sent over a pipe.

A `Worker` is a spawned process holding at most one `BroadcastGroup`. The parent sends
`(command, args)` and reads `("ok", value)` or `("err", exception class name, message)` back, so a
test coordinates ranks with pipes and deadlines, never sleeps. Workers fork from a forkserver that imported
torch once (a fresh spawn costs ~3 s of torch import per process on two cores), and a test module
keeps a pool alive.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import time
from typing import Any

import torch

BIG_BUCKET = 64 << 10  # bucket_bytes used by the tests; "big" below is 4x larger


def make_state_dict(seed: int) -> dict[str, torch.Tensor]:
    """fp32 and bf16 mixed, one tensor larger than a bucket, many small ones, a scalar, an int buffer."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {"embed": torch.randn(64, 32, generator=g)}
    for i in range(120):
        sd[f"layer{i}.w"] = torch.randn(8, 9, generator=g).to(torch.bfloat16 if i % 2 else torch.float32)
        sd[f"layer{i}.norm"] = torch.randn(9, generator=g)
    sd["big"] = torch.randn(256, 256, generator=g).to(torch.bfloat16)  # 128 KiB > 64 KiB bucket
    sd["scale"] = torch.tensor(seed + 0.5)
    sd["steps"] = torch.arange(5, dtype=torch.int64) * seed
    sd["head"] = torch.randn(32, 64, generator=g)
    return sd


def digest(named_tensors) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """name -> (dtype, shape, sha256 of the raw bytes): equal digests mean bit-identical tensors."""
    out = {}
    for name, t in named_tensors:
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[name] = (str(t.dtype), tuple(t.shape), hashlib.sha256(raw).hexdigest())
    return out


def _serve(conn, device: str) -> None:
    torch.set_num_threads(1)
    from services.weight_sync import BroadcastGroup

    group = None
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:  # the parent is gone: leave the group as a service would on shutdown
            if group is not None:
                group.close()
            return
        try:
            if cmd == "setenv":  # e.g. RFT_WEIGHT_SYNC_SHM=0: the network broadcast on one host
                os.environ[args[0]] = args[1]
                value = None
            elif cmd == "join":
                info, rank = args
                group = BroadcastGroup.join(info, rank, device)
                value: Any = group.generation
            elif cmd == "send":
                version, seed = args
                value = group.send(version, make_state_dict(seed))
            elif cmd == "send_then_die_at_ack":  # send every bucket, report, then wait to be killed
                version, seed = args

                def blocked_ack(ok: bool) -> bool:
                    conn.send(("ok", "acking"))
                    conn.recv()
                    raise AssertionError("killed before the acknowledgement")

                group._ack = blocked_ack
                value = group.send(version, make_state_dict(seed))
            elif cmd == "send_bad":
                sd = make_state_dict(args[1])
                sd["big"] = sd["big"][:1]
                value = group.send(args[0], sd)
            elif cmd == "receive":
                value = digest(group.receive(args[0]))
            elif cmd == "receive_then_block":  # take `n` tensors, report, then wait to be killed
                it = group.receive(args[0])
                for _ in range(args[1]):
                    next(it)
                conn.send(("ok", "partial"))
                conn.recv()
                value = None
            elif cmd == "receive_partial":  # stop consuming early and close the iterator
                it = group.receive(args[0])
                names = [next(it)[0] for _ in range(args[1])]
                it.close()
                value = names
            elif cmd == "close":
                if group is not None:
                    group.close()
                group, value = None, None
            else:
                raise ValueError(f"unknown command {cmd}")
            conn.send(("ok", value))
        except Exception as exc:  # report to the parent, keep serving
            conn.send(("err", type(exc).__name__, str(exc)))


class Worker:
    def __init__(self, device: str = "cpu"):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "services.weight_sync", __name__])
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, device), daemon=True)
        self.proc.start()
        child.close()

    def call(self, cmd: str, *args: Any) -> None:
        self.conn.send((cmd, args))

    def result(self, timeout: float = 30.0) -> tuple:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"worker {self.proc.pid} gave no answer within {timeout}s")
        return self.conn.recv()

    def value(self, timeout: float = 30.0) -> Any:
        res = self.result(timeout)
        if res[0] != "ok":
            raise AssertionError(f"worker failed: {res[1]}: {res[2]}")
        return res[1]

    def kill(self) -> float:
        """SIGKILL the process; returns the monotonic time of the kill."""
        os.kill(self.proc.pid, signal.SIGKILL)
        t = time.monotonic()
        self.proc.join(10)
        return t

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.close()
            self.proc.join(5)
            if self.proc.is_alive():
                self.kill()
