"""The trainer's default-group backend and the command channel of a world of one (no process group)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from services.trainer.distributed import COMMAND_TIMEOUT, CommandChannel, DistInfo, backend_for


@pytest.mark.parametrize("device", [torch.device("cuda", 0), torch.device("cuda", 3), torch.device("cuda")])
def test_cuda_ranks_get_gloo_for_cpu_tensors_and_nccl_for_cuda_tensors(device):
    assert backend_for(device) == "cpu:gloo,cuda:nccl"


def test_cpu_ranks_get_gloo():
    assert backend_for(torch.device("cpu")) == "gloo"


def test_idle_workers_wait_far_longer_than_any_collective_may_take():
    assert timedelta(days=7) <= COMMAND_TIMEOUT  # the default group's collectives: 1800 s
    assert COMMAND_TIMEOUT.total_seconds() * 1000 < 2**31  # no 32-bit millisecond field wraps it


def _info(rank: int, world_size: int) -> DistInfo:
    return DistInfo(
        rank=rank, world_size=world_size, local_rank=rank, backend="gloo", device=torch.device("cpu")
    )


def test_a_world_of_one_runs_commands_without_a_group_or_broadcast():
    calls = []
    channel = CommandChannel(_info(0, 1), {"step": lambda payload: calls.append(payload) or len(calls)})
    assert channel.group is None  # no process group is needed (none exists in this test)
    assert channel.run("step", {"n": 1}) == 1
    assert channel.run("stop") is None
    channel.stop_workers()
    assert calls == [{"n": 1}]


def test_only_rank0_issues_commands():
    with pytest.raises(RuntimeError, match="only rank 0"):
        CommandChannel(_info(1, 1), {}).run("step")
