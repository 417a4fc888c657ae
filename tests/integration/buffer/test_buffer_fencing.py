"""Fencing and takeover, on both stores (memory, and Redis against a real redis-server): a consumer that
opens with an epoch holds leases that never expire; a restarted consumer of the same name acks the
leases its checkpoint covers and gets every other one redelivered at once, in order; the old holder is
fenced out; a store that never handed out an epoch says so; the accepted log lists every accepted uid."""

from __future__ import annotations

import grpc
import pytest

from services.buffer.records import ConsumerNotOpen, FencedError, LeaseError, LeaseRequest, OpenRequest
from services.common.lineage import experience_uid
from tests.support.buffer_data import decode_uids, group, records


def req(size: int, epoch: int, *, consumer: str = "trainer", lease_ms: int = 1) -> LeaseRequest:
    return LeaseRequest("g", consumer, size, 0, lease_ms, True, epoch=epoch)


async def test_takeover_acks_covered_leases_and_redelivers_the_rest_in_order(store):
    await store.put(records(group("a", 2), group("b", 2), group("c", 2), group("d", 2)))
    first = await store.open_consumer(OpenRequest("g", "trainer"))
    assert first.epoch == 1 and first.acked == first.released == 0
    leases = [await store.lease(req(2, first.epoch)) for _ in range(3)]
    assert all(out.committed for out in leases)
    # the restarted trainer's checkpoint holds the first lease's step; the other two were not durable
    second = await store.open_consumer(OpenRequest("g", "trainer", [leases[0].lease_id]))
    assert (second.epoch, second.acked, second.released) == (2, 2, 4)
    again = await store.lease(req(6, second.epoch))
    # redeliveries first, in stream order, then the unread group
    assert decode_uids(again.payloads) == decode_uids(leases[1].payloads + leases[2].payloads) + [
        f"/d/{i}" for i in range(2)
    ]
    assert again.redelivered == 4
    stats = await store.stats("g")
    assert stats.acked == 2


async def test_stale_epoch_is_fenced_everywhere(store):
    await store.put(records(group("a", 2), group("b", 2)))
    old = await store.open_consumer(OpenRequest("g", "trainer"))
    lease = await store.lease(req(2, old.epoch))
    new = await store.open_consumer(OpenRequest("g", "trainer"))
    with pytest.raises(FencedError):
        await store.lease(req(2, old.epoch))
    with pytest.raises((FencedError, LeaseError)):  # the lease went back for redelivery
        await store.ack("g", lease.lease_id, old.epoch)
    taken = await store.lease(req(2, new.epoch))
    with pytest.raises(FencedError):
        await store.ack("g", taken.lease_id, old.epoch)
    assert await store.ack("g", taken.lease_id, new.epoch) == 2


async def test_fenced_leases_never_expire(store):
    await store.put(records(group("a", 2)))
    opened = await store.open_consumer(OpenRequest("g", "trainer"))
    lease = await store.lease(req(2, opened.epoch, lease_ms=1))
    assert lease.committed and lease.deadline_ms == 0
    other = await store.open_consumer(OpenRequest("g", "other"))
    assert not (await store.lease(req(2, other.epoch, consumer="other"))).committed
    assert await store.ack("g", lease.lease_id, opened.epoch) == 2


async def test_unknown_epoch_is_not_open(store):
    await store.put(records(group("a", 2)))
    with pytest.raises(ConsumerNotOpen):
        await store.lease(req(2, 7))


async def test_takeover_leaves_other_consumers_alone(store):
    await store.put(records(group("a", 2), group("b", 2)))
    mine = await store.open_consumer(OpenRequest("g", "trainer"))
    theirs = await store.open_consumer(OpenRequest("g", "other"))
    held = await store.lease(req(2, theirs.epoch, consumer="other"))
    await store.lease(req(2, mine.epoch))
    reopened = await store.open_consumer(OpenRequest("g", "trainer"))
    assert reopened.released == 2
    assert await store.ack("g", held.lease_id, theirs.epoch) == 2


async def test_accepted_log_lists_every_accepted_uid(store):
    batch = group("a", 3) + group("b", 2)
    await store.put(records(batch))
    await store.put(records(group("c", 1)), producer="p", sequence=5)
    await store.put(records(group("c", 1)), producer="p", sequence=5)  # duplicate: not logged again
    logged = await store.accepted_uids()
    assert logged == [experience_uid(e.eid) for e in batch] + [experience_uid(group("c", 1)[0].eid)]
    assert await store.accepted_uids(1, 2) == logged[1:3]


async def test_reopen_keeping_held_leases_gives_back_only_the_lost_one(store):
    await store.put(records(group("a", 2), group("b", 2)))
    first = await store.open_consumer(OpenRequest("g", "trainer"))
    held = await store.lease(req(2, first.epoch))
    lost = await store.lease(req(2, first.epoch))  # its reply never reached the consumer
    again = await store.open_consumer(OpenRequest("g", "trainer", keep_lease_ids=[held.lease_id]))
    assert (again.epoch, again.acked, again.released) == (2, 0, 2)
    redelivered = await store.lease(req(2, again.epoch))
    assert decode_uids(redelivered.payloads) == decode_uids(lost.payloads)
    assert await store.ack("g", held.lease_id, again.epoch) == 2  # moved to the new epoch


async def test_a_stale_trainer_is_fenced_over_grpc(store_factory):
    """Two trainers of one name on a real grpc.aio server: the newer one's OpenConsumer takes the
    older one's lease back at once; the older one's Ack and GetBatch are refused (ABORTED)."""
    from services.buffer.core import BufferCore
    from services.buffer.servicer import registration
    from services.common.buffer_client import BufferClient, ConsumerFenced
    from services.common.rpc import create_channel, start_server
    from tests.support.buffer_data import batch

    store = await store_factory(consumer_groups=("default",))
    handle = await start_server([registration(BufferCore(store))])
    channel = create_channel(handle.address, timeout_s=10)
    try:
        producer = BufferClient(channel, producer_id="p")
        await producer.put_proto(batch(group("a", 2), group("b", 2)))
        old = BufferClient(channel, consumer="trainer", retry_deadline_s=2)
        new = BufferClient(channel, consumer="trainer", retry_deadline_s=2)
        await old.open_consumer()
        leased = await old.get_batch(2, timeout_ms=100)
        opened = await new.open_consumer()
        assert opened.epoch == old.epoch + 1 and opened.released == 2
        with pytest.raises(ConsumerFenced):
            await old.ack(leased.lease_id)
        with pytest.raises(ConsumerFenced, match="stale") as info:
            await old.get_batch(2, timeout_ms=100)
        assert info.value.__cause__.code() == grpc.StatusCode.ABORTED
        again = await new.get_batch(4, timeout_ms=100)
        assert [e.eid.group_id for e in again.experiences] == ["a", "a", "b", "b"]
        assert await new.ack(again.lease_id) == 4
    finally:
        await channel.close()
        await handle.stop(0)
