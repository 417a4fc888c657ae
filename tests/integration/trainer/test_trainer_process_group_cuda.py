"""The trainer's default process group on CUDA (gpu tier; skipped without CUDA).

`ensure_process_group` on a GPU makes one `cpu:gloo,cuda:nccl` group: the CPU float64 metric sums of
actor and critic and the object collectives go over gloo, a CUDA bf16 tensor over NCCL; the command
channel has a gloo group of its own.  Each world runs in spawned processes, so no group leaks into
other tests.  Two ranks on one GPU share no NCCL communicator: there the CUDA all-reduce runs in the
world of one only (and in a world of two when two GPUs exist).
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time
from typing import Any

import pytest
import torch

from services.trainer.distributed import free_port
from tests.support.trainer_process_group_ranks import cuda_rank

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEADLINE_S = 180.0


def _run_world(world: int) -> tuple[dict[int, dict[str, Any]], list[tuple]]:
    """Each rank's checks and the worker's channel reports; every rank must exit 0."""
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=cuda_rank, args=(rank, world, port, messages), name=f"cuda-rank{rank}", daemon=True
        )
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    got: list[tuple] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len([m for m in got if m[0] == "checks"]) < world:
            left = deadline - time.monotonic()
            assert left > 0 and all(p.exitcode in (None, 0) for p in procs), (
                got,
                [p.exitcode for p in procs],
            )
            try:
                got.append(messages.get(timeout=min(left, 5.0)))
            except queue_mod.Empty:
                continue
        for p in procs:
            p.join(timeout=60)
        assert [p.exitcode for p in procs] == [0] * world, got
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    return {m[1]: m[2] for m in got if m[0] == "checks"}, [m for m in got if m[0] == "worker"]


def test_world_of_one_reduces_cpu_float64_and_cuda_bf16_in_one_group():
    checks, _ = _run_world(1)
    out = checks[0]
    assert out["backend"] == out["info_backend"] == "cpu:gloo,cuda:nccl"
    assert out["device"] == "cuda:0"
    assert out["cpu_sum"] == [1.0, 1.0, 1.0]
    assert out["cuda_sum"] == [1.0] * 4 and out["cuda_device"] == "cuda:0"
    assert out["gathered"] == [{"rank": 0}]
    assert out["channel_backend"] is None  # a world of one broadcasts nothing
    assert out["ran"] == {"payload": [0.0, 1.0, 2.0], "payload_device": "cpu"}


def test_two_ranks_use_gloo_for_cpu_collectives_and_the_command_channel():
    checks, workers = _run_world(2)
    two_gpus = torch.cuda.device_count() >= 2
    for rank in (0, 1):
        out = checks[rank]
        assert out["backend"] == out["info_backend"] == "cpu:gloo,cuda:nccl"
        assert out["cpu_sum"] == [3.0, 3.0, 3.0]  # 1 + 2 over gloo
        assert out["gathered"] == [{"rank": 0}, {"rank": 1}]
        assert out["channel_backend"] == "gloo"
        if two_gpus:
            assert out["cuda_sum"] == [3.0] * 4 and out["cuda_device"] == f"cuda:{rank}"
        else:
            assert "cuda_sum" not in out  # one GPU: the two ranks never form an NCCL communicator
    # the command's payload reached the worker over the channel as a CPU object
    assert workers == [("worker", 1, {"payload": [0.0, 1.0, 2.0], "payload_device": "cpu"})]
