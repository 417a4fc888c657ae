"""Joining a broadcast-group instance, on real TCPStores and gloo groups in threads: a member that
comes before its host waits for it quietly and joins; the host waits for every member; either side
gives up at once (`StaleGenerationError`) when told the instance was superseded, well inside the
group's timeout, instead of holding the run for `sync_timeout`."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

from services.weight_sync import GroupInfo, StaleGenerationError, free_port, specs_of
from services.weight_sync.wire.broadcast import BroadcastGroup

TIMEOUT_S = 600.0  # what a stuck join would wait without being abandoned
GIVE_UP_S = 30.0  # what the tests allow for giving up (the join looks every 0.5 s)


def _info(world_size: int = 2) -> GroupInfo:
    specs = specs_of({"w": torch.zeros(4)})
    return GroupInfo(
        "127.0.0.1", free_port(), world_size, specs, generation=3, backend="gloo", timeout_s=TIMEOUT_S
    )


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as ex:
        yield ex


def test_a_member_that_comes_before_its_host_joins_and_receives(pool):
    info = _info()
    member: Future = pool.submit(BroadcastGroup.join, info, 1)
    host = BroadcastGroup.join(info, 0)
    receiver = member.result(GIVE_UP_S)
    got = pool.submit(lambda: dict(receiver.receive(1)))
    host.send(1, {"w": torch.arange(4.0)})
    assert torch.equal(got.result(GIVE_UP_S)["w"], torch.arange(4.0))
    host.close()
    receiver.close()


@pytest.mark.parametrize("rank", [0, 1], ids=["host waiting for a member", "member waiting for its host"])
def test_a_join_gives_up_when_abandoned(pool, rank):
    abandon = threading.Event()
    join: Future = pool.submit(BroadcastGroup.join, _info(), rank, "cpu", abandon)
    with pytest.raises(TimeoutError):
        join.result(1.0)  # blocked: the other side never comes
    abandon.set()
    with pytest.raises(StaleGenerationError, match="newer generation"):
        join.result(GIVE_UP_S)
