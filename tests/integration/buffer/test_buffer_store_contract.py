"""The store contract, run on both stores (memory, and Redis against a real redis-server): ordering,
whole groups, leases, redelivery, ack finality, staleness, capacity, idempotent puts, consumer groups,
and concurrent producers and consumers with no loss and no duplicates."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.buffer.core import BufferCore
from services.buffer.records import BufferFull, LeaseError, LeaseRequest
from services.buffer.settings import BufferSettings
from tests.support.buffer_data import decode_uids, group, records


def req(size: int, *, group_name: str = "g", min_version: int = 0, lease_ms: int = 60_000, partial=True):
    return LeaseRequest(group_name, "c", size, min_version, lease_ms, partial)


def uids(prefix: str, n: int) -> list[str]:
    return [f"/{prefix}/{i}" for i in range(n)]


async def test_ordering_within_a_producer(store):
    for k in range(10):
        await store.put(records(group(f"g{k}", 2)))
    seen = []
    for _ in range(5):
        out = await store.lease(req(4))
        assert out.committed and out.n == 4
        seen += decode_uids(out.payloads)
        await store.ack("g", out.lease_id)
    assert seen == [u for k in range(10) for u in uids(f"g{k}", 2)]


async def test_whole_groups_never_split(store):
    await store.put(records(group("a", 3), group("b", 3), group("c", 3)))
    out = await store.lease(req(4, partial=False))
    assert not out.committed and out.available == 3  # a full batch of 4 would split group b
    out = await store.lease(req(4))
    assert out.committed and decode_uids(out.payloads) == uids("a", 3)
    out = await store.lease(req(6, partial=False))
    assert out.committed and decode_uids(out.payloads) == uids("b", 3) + uids("c", 3)


async def test_group_larger_than_size_goes_alone(store):
    await store.put(records(group("big", 5), group("small", 1)))
    out = await store.lease(req(2))
    assert out.committed and decode_uids(out.payloads) == uids("big", 5)


async def test_core_waits_then_returns_partial(store):
    core = BufferCore(store, BufferSettings(poll_interval_s=0.01, consumer_groups=("g",)))
    await store.put(records(group("a", 3)))
    started = time.monotonic()
    batch = await core.get_batch(size=8, timeout_ms=150, consumer_group="g")
    assert batch.partial and batch.n == 3 and batch.lease_id
    assert time.monotonic() - started >= 0.14


async def test_core_wakes_when_a_producer_completes_the_batch(store):
    core = BufferCore(store, BufferSettings(poll_interval_s=0.01, consumer_groups=("g",)))
    await core.put(_batch(group("a", 4)))
    waiter = asyncio.ensure_future(core.get_batch(size=8, timeout_ms=10_000, consumer_group="g"))
    await asyncio.wait_for(_until(lambda: _waiting(store)), 5)
    await core.put(_batch(group("b", 4)))
    batch = await asyncio.wait_for(waiter, 5)
    assert not batch.partial and batch.n == 8


async def test_lease_expiry_redelivers(store):
    await store.put(records(group("a", 2)))
    first = await store.lease(req(2, lease_ms=100))
    assert first.committed
    assert not (await store.lease(req(2))).committed  # leased, not visible
    second = await _lease_until_committed(store, req(2), timeout_s=5)
    assert decode_uids(second.payloads) == decode_uids(first.payloads)
    assert second.redelivered == 2
    with pytest.raises(LeaseError, match="expired|unknown"):
        await store.ack("g", first.lease_id)  # the old lease cannot ack what was redelivered
    assert await store.ack("g", second.lease_id) == 2
    stats = await store.stats("g")
    assert stats.redelivered == 2 and stats.acked == 2 and stats.size == 0


async def test_nack_redelivers_first(store):
    await store.put(records(group("a", 2), group("b", 2)))
    out = await store.lease(req(2))
    assert await store.nack("g", out.lease_id) == 2
    again = await store.lease(req(4))
    assert decode_uids(again.payloads) == uids("a", 2) + uids("b", 2)
    assert again.redelivered == 2


async def test_ack_is_final(store):
    await store.put(records(group("a", 2)))
    out = await store.lease(req(2))
    assert await store.ack("g", out.lease_id) == 2
    assert await store.ack("g", out.lease_id) == 2  # a retried ack is answered, not re-applied
    with pytest.raises(LeaseError):
        await store.nack("g", out.lease_id)
    assert not (await store.lease(req(2))).committed
    stats = await store.stats("g")
    assert stats.acked == 2 and stats.size == 0 and stats.pending_leases == 0
    with pytest.raises(LeaseError):
        await store.ack("g", "no-such-lease")


async def test_staleness_filter_drops_and_counts(store):
    await store.put(records(group("old", 2, model_version=1), group("new", 2, model_version=3)))
    await store.put(records(group("older", 3, model_version=0)))
    out = await store.lease(req(10, min_version=2))
    assert decode_uids(out.payloads) == uids("new", 2)
    assert out.dropped_stale == 5
    await store.ack("g", out.lease_id)
    stats = await store.stats("g")
    assert stats.dropped_stale == 5 and stats.size == 0 and stats.per_model_version == {}


async def test_capacity_refuses_whole_batch(store_factory):
    store = await store_factory(capacity=5)
    await store.put(records(group("a", 4)))
    with pytest.raises(BufferFull):
        await store.put(records(group("b", 1), group("c", 1)))
    stats = await store.stats("g")
    assert stats.size == 4 and stats.accepted == 4 and stats.per_model_version == {0: 4}
    out = await store.lease(req(4))
    await store.ack("g", out.lease_id)
    await store.put(records(group("b", 1), group("c", 1)))
    assert (await store.stats("g")).size == 2


async def test_core_on_full_wait_blocks_until_ack(store_factory):
    store = await store_factory(capacity=4)
    core = BufferCore(store, BufferSettings(on_full="wait", poll_interval_s=0.01, consumer_groups=("g",)))
    await core.put(_batch(group("a", 4)))
    put = asyncio.ensure_future(core.put(_batch(group("b", 2))))
    batch = await core.get_batch(size=4, consumer_group="g")
    assert not put.done()
    await core.ack(batch.lease_id, "g")
    outcome = await asyncio.wait_for(put, 5)
    assert outcome.stored == 2


async def test_core_on_full_reject(store_factory):
    store = await store_factory(capacity=4)
    core = BufferCore(store, BufferSettings(on_full="reject"))
    await core.put(_batch(group("a", 4)))
    with pytest.raises(BufferFull):
        await core.put(_batch(group("b", 1)))


async def test_sequenced_put_is_idempotent(store):
    assert (await store.put(records(group("a", 2)), producer="p", sequence=1)).stored == 2
    dup = await store.put(records(group("a", 2)), producer="p", sequence=1)
    assert dup.duplicate and dup.stored == 0
    assert (await store.put(records(group("b", 2)), producer="p", sequence=2)).stored == 2
    assert (await store.stats("g")).size == 4


async def test_each_consumer_group_sees_every_group_once(store_factory):
    store = await store_factory(consumer_groups=("t1", "t2"))
    await store.put(records(group("a", 2), group("b", 2)))
    leases = {}
    for name in ("t1", "t2"):
        out = await store.lease(req(4, group_name=name))
        assert decode_uids(out.payloads) == uids("a", 2) + uids("b", 2)
        assert not (await store.lease(req(4, group_name=name))).committed
        leases[name] = out.lease_id
    await store.ack("t1", leases["t1"])
    assert (await store.stats("t1")).size == 4  # t2 still needs them
    await store.ack("t2", leases["t2"])
    assert (await store.stats("t1")).size == 0


async def test_concurrent_producers_and_consumers_no_loss_no_duplicates(store):
    core = BufferCore(store, BufferSettings(poll_interval_s=0.01, consumer_groups=("g",)))
    producers, groups_each, group_size = 4, 500, 5  # 10,000 experiences
    total = producers * groups_each * group_size
    delivered: list[str] = []
    done = asyncio.Event()

    async def produce(p: int) -> None:
        for k in range(0, groups_each, 10):
            await core.put(_batch(*[group(f"p{p}-{k + j}", group_size) for j in range(10)]))

    async def consume() -> None:
        while not done.is_set():
            batch = await core.get_batch(size=50, timeout_ms=50, consumer_group="g")
            if batch.lease_id:
                got = decode_uids(batch.payloads)
                assert len(got) % group_size == 0
                delivered.extend(got)
                await core.ack(batch.lease_id, "g")
            if len(delivered) >= total:
                done.set()

    await asyncio.wait_for(
        asyncio.gather(*[produce(p) for p in range(producers)], *[consume() for _ in range(3)]), 60
    )
    assert len(delivered) == total
    assert len(set(delivered)) == total
    expected = {
        f"/p{p}-{k}/{i}" for p in range(producers) for k in range(groups_each) for i in range(group_size)
    }
    assert set(delivered) == expected
    stats = await store.stats("g")
    assert stats.acked == total and stats.size == 0 and stats.pending_leases == 0


def _batch(*groups):
    from tests.support.buffer_data import batch

    return batch(*groups)


async def test_stats_age_the_oldest_lease_held(store):
    """Stats' oldest lease age: 0 with none held, growing while one is held, the next oldest's once the
    first is acked, 0 again once every lease is settled (acked, nacked or expired)."""
    await store.put(records(group("a", 2), group("b", 2), group("c", 2)))
    assert (await store.stats("g")).oldest_lease_age_s == 0
    first = await store.lease(req(2))

    async def aged(lower: float) -> bool:
        return (await store.stats("g")).oldest_lease_age_s >= lower

    await asyncio.wait_for(_until(lambda: aged(0.5)), 5)
    second = await store.lease(req(2))
    before = (await store.stats("g")).oldest_lease_age_s
    await store.ack("g", first.lease_id)
    after = (await store.stats("g")).oldest_lease_age_s
    assert after < before and after < 30  # the second lease's, taken 0.5 s or more after the first
    await store.nack("g", second.lease_id)
    assert (await store.stats("g")).oldest_lease_age_s == 0
    await store.lease(req(2, lease_ms=100))  # expires: the expiry forgets it too
    await asyncio.wait_for(_until(lambda: _expired(store)), 5)
    assert (await store.stats("g")).oldest_lease_age_s == 0


async def _expired(store) -> bool:
    stats = await store.stats("g")
    return stats.pending_leases == 0


async def _until(predicate) -> None:
    while not await predicate():
        await asyncio.sleep(0.005)  # ok-sleep: polling with a deadline (callers wrap in wait_for)


async def _waiting(store) -> bool:
    """True once the waiting consumer's group exists (its first lease attempt has run)."""
    return (await store.lease(req(1_000_000, partial=False))).available == 4


async def _lease_until_committed(store, request, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = await store.lease(request)
        if out.committed:
            return out
        await asyncio.sleep(0.01)  # ok-sleep: polling with a deadline for the lease to expire
    raise AssertionError("lease was not redelivered in time")
