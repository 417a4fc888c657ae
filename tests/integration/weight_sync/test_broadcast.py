"""The nccl weight-sync method over real torch.distributed gloo groups, one process per rank.

Workers are started once per module (tests/support/weight_sync_worker.py) and driven over pipes;
every wait has a deadline and nothing sleeps for synchronisation.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from services.weight_sync import GroupInfo, free_port, specs_of
from tests.support.weight_sync_worker import BIG_BUCKET, Worker, digest, make_state_dict

SPECS = tuple(specs_of(make_state_dict(0)))


def _info(world: int, generation: int = 0, timeout_s: float = 10.0, backend: str = "gloo") -> GroupInfo:
    return GroupInfo(
        "127.0.0.1", free_port(), world, specs=SPECS, generation=generation, timeout_s=timeout_s,
        bucket_bytes=BIG_BUCKET, backend=backend,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pool():
    workers = [Worker() for _ in range(4)]
    yield workers
    for w in workers:
        w.stop()


def _join(workers: list[Worker], info: GroupInfo) -> None:
    for rank, w in enumerate(workers):
        w.call("join", info, rank)
    for w in workers:
        assert w.value() == info.generation


def _close(workers: list[Worker]) -> None:
    for w in workers:
        w.call("close")
    for w in workers:
        w.value()


def _broadcast_and_check(workers: list[Worker], version: int, seed: int) -> None:
    sender, receivers = workers[0], workers[1:]
    for r in receivers:
        r.call("receive", version)
    sender.call("send", version, seed)
    stats = sender.value()
    assert stats.version == version and stats.buckets >= 3  # packed buckets and a solo one
    want = digest(make_state_dict(seed).items())
    for r in receivers:
        got = r.value()
        assert list(got) == [s.name for s in SPECS]  # spec order
        assert got == want  # dtype, shape and bytes identical


@pytest.mark.parametrize("shared_memory", ["1", "0"])
def test_one_sender_two_receivers_get_bit_identical_tensors(pool, shared_memory):
    """On one host the buckets go through /dev/shm; with RFT_WEIGHT_SYNC_SHM=0 over the gloo broadcast."""
    workers = pool[:3]
    workers[0].call("setenv", "RFT_WEIGHT_SYNC_SHM", shared_memory)
    workers[0].value()
    try:
        info = _info(3)
        _join(workers, info)
        _broadcast_and_check(workers, version=1, seed=11)
        _broadcast_and_check(workers, version=2, seed=12)  # the group is reusable
        shm = f"/dev/shm/rft-wsync-{info.group_name}-{info.master_port}-g{info.generation}"
        expect_file = shared_memory == "1" and os.path.isdir("/dev/shm")  # no tmpfs: the network path
        assert os.path.exists(shm) == expect_file  # the sender's file, while the group lives
        _close(workers)
        assert not os.path.exists(shm)  # removed when the sender closes the group
    finally:
        workers[0].call("setenv", "RFT_WEIGHT_SYNC_SHM", "1")
        workers[0].value()


def test_teardown_and_rebuild_with_new_generation_lets_a_third_receiver_join(pool):
    _join(pool[:3], _info(3, generation=4))
    _broadcast_and_check(pool[:3], version=1, seed=21)
    _close(pool[:3])
    _join(pool, _info(4, generation=5))  # same processes, new instance, one more member
    _broadcast_and_check(pool, version=2, seed=22)
    _close(pool)


def test_stale_generation_is_refused(pool):
    info = _info(2, generation=7, timeout_s=3.0)
    pool[0].call("join", info, 0)
    stale = GroupInfo(info.master_address, info.master_port, 2, specs=SPECS, generation=6, timeout_s=3.0)
    pool[1].call("join", stale, 1)
    res = pool[1].result()
    assert res[0] == "err" and res[1] == "StaleGenerationError" and "generation 7" in res[2]
    res = pool[0].result(timeout=15)  # rank 0 gives up waiting for the missing member
    assert res[0] == "err" and res[1] == "GroupBrokenError"
    _close(pool[:2])


def test_sender_abort_and_early_close_fail_loudly_and_keep_the_group_usable(pool):
    workers = pool[:3]
    _join(workers, _info(3))
    for r in workers[1:]:
        r.call("receive", 1)
    workers[0].call("send_bad", 1, 3)
    res = workers[0].result()
    assert res[0] == "err" and res[1] == "WeightSyncError" and "big" in res[2]
    for r in workers[1:]:
        res = r.result()
        assert res[0] == "err" and "aborted" in res[2]
    # a receiver that stops early drains the rest and acknowledges failure; the sender says so
    workers[1].call("receive_partial", 2, 3)
    workers[2].call("receive", 2)
    workers[0].call("send", 2, 5)
    res = workers[0].result()
    assert res[0] == "err" and "failed to consume version 2" in res[2]
    assert workers[1].value() == [s.name for s in SPECS[:3]]
    assert workers[2].value() == digest(make_state_dict(5).items())
    _broadcast_and_check(workers, version=3, seed=6)
    _close(workers)


def test_receiver_killed_mid_broadcast_makes_the_others_fail_within_the_timeout(pool):
    timeout_s = 5.0
    workers = pool[:3]
    _join(workers, _info(3, timeout_s=timeout_s))
    victim = workers[2]
    workers[1].call("receive", 1)
    victim.call("receive_then_block", 1, 10)
    workers[0].call("send", 1, 7)
    assert victim.value() == "partial"  # it holds some tensors; the rest is in flight
    killed_at = victim.kill()
    for w in workers[:2]:
        res = w.result(timeout=timeout_s + 10)
        elapsed = time.monotonic() - killed_at
        assert res[0] == "err" and res[1] == "GroupBrokenError", res
        assert elapsed < timeout_s + 3.0
    _close(workers[:2])


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="needs CUDA with 3 GPUs (one NCCL rank per GPU)")
def test_nccl_backend_broadcast_is_bit_identical():
    workers = [Worker(device=f"cuda:{i}") for i in range(3)]
    try:
        _join(workers, _info(3, backend="nccl"))
        _broadcast_and_check(workers, version=1, seed=31)
        _close(workers)
    finally:
        for w in workers:
            w.stop()
