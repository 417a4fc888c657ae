"""Failure paths of the nccl weight-sync method: a member that dies at each stage of a join or a send.

gloo tests run everywhere; the `gpu` ones check the NCCL-only behaviours on one GPU (a communicator
that can never be built, two ranks on one GPU). Every rank is a real process, killed with SIGKILL;
waits have deadlines, nothing sleeps for synchronisation. A receiver killed mid-send is in
test_broadcast.py.
"""

from __future__ import annotations

import time

import pytest
import torch

from services.weight_sync import GroupInfo, free_port, specs_of
from services.weight_sync.errors import GroupBrokenError
from services.weight_sync.wire.group import check_distinct_devices
from tests.support.weight_sync_store_member import StoreMember
from tests.support.weight_sync_worker import BIG_BUCKET, Worker, make_state_dict

SPECS = tuple(specs_of(make_state_dict(0)))
SLACK_S = 5.0  # process start-up and reporting on a loaded machine


def _info(timeout_s: float, backend: str = "gloo", world: int = 2) -> GroupInfo:
    return GroupInfo(
        "127.0.0.1", free_port(), world, specs=SPECS, timeout_s=timeout_s, bucket_bytes=BIG_BUCKET,
        backend=backend,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pool():
    workers = [Worker() for _ in range(2)]
    yield workers
    for w in workers:
        w.stop()


def _alive(worker: Worker) -> None:
    """The worker process survived and still answers commands."""
    worker.call("close")
    assert worker.value() is None
    assert worker.proc.is_alive()


def test_a_receiver_that_joins_the_store_then_dies_breaks_rank_0s_join_within_the_timeout(pool):
    timeout_s = 4.0
    info = _info(timeout_s)
    sender = pool[0]
    sender.call("join", info, 0)
    member = StoreMember(info, 1)
    member.registered()
    killed_at = member.kill()  # registered in the store, never built its process group
    res = sender.result(timeout=timeout_s + 30)
    assert res[0] == "err" and res[1] == "GroupBrokenError", res
    assert time.monotonic() - killed_at < timeout_s + SLACK_S
    _alive(sender)


def test_a_receiver_killed_before_the_first_broadcast_breaks_the_send_within_the_timeout(pool):
    timeout_s = 4.0
    info = _info(timeout_s)
    victim = Worker()
    try:
        pool[0].call("join", info, 0)
        victim.call("join", info, 1)
        assert pool[0].value() == 0 and victim.value() == 0
        killed_at = victim.kill()
        pool[0].call("send", 1, 3)
        res = pool[0].result(timeout=timeout_s + 30)
        assert res[0] == "err" and res[1] == "GroupBrokenError", res
        assert time.monotonic() - killed_at < timeout_s + SLACK_S
        _alive(pool[0])
    finally:
        victim.stop()


def test_two_ranks_on_one_gpu_are_refused_with_what_to_do():
    keys = ["host|GPU-a", "host|GPU-b", "host|GPU-a"]
    with pytest.raises(GroupBrokenError, match=r"ranks 0 and 2 are on the same GPU.*gloo.*memory"):
        check_distinct_devices(keys, 1, "g")
    check_distinct_devices(["host|GPU-a", "other|GPU-a", "", ""], 0, "g")  # other hosts, CPUs: fine


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("how", ["exits", "killed"])
def test_nccl_rank_0_gets_group_broken_when_a_receiver_dies_before_the_communicator_exists(how):
    timeout_s = 20.0
    info = _info(timeout_s, backend="nccl")
    sender = Worker(device="cuda:0")
    try:
        sender.call("join", info, 0)
        member = StoreMember(info, 1, exit_after=how == "exits")
        member.registered()
        gone_at = member.kill()
        res = sender.result(timeout=timeout_s + 60)
        assert res[0] == "err" and res[1] == "GroupBrokenError", res
        assert time.monotonic() - gone_at < timeout_s + SLACK_S
        _alive(sender)  # no watchdog abort, no hang: the process goes on
    finally:
        sender.stop()


@pytest.mark.gpu
@needs_cuda
def test_nccl_two_processes_on_one_gpu_fail_clearly_within_the_timeout():
    timeout_s = 20.0
    info = _info(timeout_s, backend="nccl")
    workers = [Worker(device="cuda:0") for _ in range(2)]
    try:
        start = time.monotonic()
        for rank, w in enumerate(workers):
            w.call("join", info, rank)
        for w in workers:
            res = w.result(timeout=timeout_s + 60)
            assert res[0] == "err" and res[1] == "GroupBrokenError", res
            assert "same GPU" in res[2] and "sync_method: memory" in res[2], res
        assert time.monotonic() - start < timeout_s + SLACK_S
        for w in workers:
            _alive(w)
    finally:
        for w in workers:
            w.stop()
