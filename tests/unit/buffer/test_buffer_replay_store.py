"""Replay-buffer store: linear_decay priority, reuse after the cooldown, capped by use_count_limit,
use_count carried by each handed-out copy; nack does not count a use. A fake clock drives time."""

from __future__ import annotations

import pytest

from services.buffer.records import LeaseError, LeaseRequest, OpenRequest
from services.buffer.replay_store import ReplayStore
from tests.support.buffer_data import decode_uids, group, records


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def req(size: int, partial: bool = True) -> LeaseRequest:
    return LeaseRequest("g", "c", size, 0, 60_000, partial)


def use_counts(payloads):
    from rft.v1 import buffer_pb2

    return [e.use_count for e in buffer_pb2.GetBatchResponse.FromString(b"".join(payloads)).experiences]


async def test_highest_priority_first_and_reuse_after_cooldown():
    clock = Clock()
    store = ReplayStore(100, decay=2.0, reuse_cooldown_s=1.0, use_count_limit=3, clock_ms=clock)
    await store.put(records(group("old", 2, model_version=1), group("new", 2, model_version=4)))
    first = await store.lease(req(2))
    assert decode_uids(first.payloads) == ["/new/0", "/new/1"]  # priority 4 > 1
    await store.ack("g", first.lease_id)
    # "new" is cooling down: "old" is served, then nothing until the cooldown ends
    second = await store.lease(req(2))
    assert decode_uids(second.payloads) == ["/old/0", "/old/1"]
    await store.ack("g", second.lease_id)
    assert not (await store.lease(req(2))).committed
    clock.now += 1000
    # new: 4 - 2*1 = 2 > old: 1 - 2*1 = -1
    third = await store.lease(req(2))
    assert decode_uids(third.payloads) == ["/new/0", "/new/1"] and use_counts(third.payloads) == [1, 1]


async def test_use_count_limit_caps_reuse_and_nack_does_not_count():
    clock = Clock()
    store = ReplayStore(100, reuse_cooldown_s=0.0, use_count_limit=2, clock_ms=clock)
    await store.put(records(group("a", 2)))
    lease = await store.lease(req(2))
    assert await store.nack("g", lease.lease_id) == 2
    served = 0
    while (out := await store.lease(req(2))).committed:
        assert use_counts(out.payloads) == [served, served]
        await store.ack("g", out.lease_id)
        served += 1
    assert served == 2
    stats = await store.stats("g")
    assert stats.size == 0 and stats.acked == 4


async def test_no_reuse_without_cooldown_and_lease_errors():
    store = ReplayStore(100, reuse_cooldown_s=None)
    await store.put(records(group("a", 1)))
    out = await store.lease(req(1))
    await store.ack("g", out.lease_id)
    assert not (await store.lease(req(1))).committed
    with pytest.raises(LeaseError):
        await store.nack("g", out.lease_id)


async def test_open_consumer_acks_keeps_and_gives_back_its_leases():
    store = ReplayStore(100, reuse_cooldown_s=None)
    await store.put(records(group("a", 2), group("b", 2), group("c", 2)))
    first = await store.open_consumer(OpenRequest("g", "c"))
    acked, kept, lost = [
        await store.lease(LeaseRequest("g", "c", 2, 0, 60_000, True, first.epoch)) for _ in "abc"
    ]
    again = await store.open_consumer(OpenRequest("g", "c", [acked.lease_id], [kept.lease_id]))
    assert (again.epoch, again.acked, again.released) == (2, 2, 2)
    back = await store.lease(LeaseRequest("g", "c", 2, 0, 60_000, True, again.epoch))
    assert decode_uids(back.payloads) == decode_uids(lost.payloads)
    assert await store.ack("g", kept.lease_id, again.epoch) == 2  # moved to the new epoch
