"""The Redis layout against a real redis-server: payloads live in `<prefix>:data` beside the stream and go
with their entry once acked; `rft audit` reads the experiences still stored from there; an entry that an
older buffer wrote with its payload inside the stream (`d`) is still leased and audited."""

from __future__ import annotations

import uuid

import pytest

from launcher.audit import redis_records
from services.buffer.records import LeaseRequest
from services.buffer.redis_store import RedisStore
from tests.support.buffer_data import decode_uids, group, records


@pytest.fixture
async def redis_store(redis_server):
    store = RedisStore(redis_server.url, capacity=1000, prefix=f"t-{uuid.uuid4().hex[:8]}")
    await store.start(("g",))
    yield store
    await store.close()


def req(size: int) -> LeaseRequest:
    return LeaseRequest("g", "trainer", size, 0, 60_000, True)


async def test_payloads_leave_with_their_entries_and_the_audit_reads_the_rest(redis_store, redis_server):
    store = redis_store
    await store.put(records(group("a", 2), group("b", 2), group("c", 2)))
    assert await store.client.hlen(store._key("data")) == 3
    out = await store.lease(req(4))
    assert decode_uids(out.payloads) == ["/a/0", "/a/1", "/b/0", "/b/1"]
    await store.ack("g", out.lease_id)
    assert await store.client.hlen(store._key("data")) == 1
    accepted, remaining = redis_records(redis_server.url, store.prefix)
    assert accepted == [f"/{g}/0/{i}" for g in "abc" for i in range(2)]
    assert remaining == ["/c/0/0", "/c/0/1"]


async def test_an_entry_with_its_payload_in_the_stream_is_still_served(redis_store, redis_server):
    store = redis_store
    await store.put(records(group("a", 2)))
    (old,) = records(group("z", 2))
    # what an older buffer wrote: the payload in the entry's `d` field, nothing in <prefix>:data
    fields = {"g": old.group_id, "n": old.n, "v": old.min_version, "vc": old.versions_text, "d": old.payload}
    await store.client.xadd(store._key("stream"), fields)
    await store.client.hincrby(store._key("meta"), "size", old.n)
    assert sorted(redis_records(redis_server.url, store.prefix)[1]) == [
        "/a/0/0",
        "/a/0/1",
        "/z/0/0",
        "/z/0/1",
    ]
    out = await store.lease(req(4))
    assert decode_uids(out.payloads) == ["/a/0", "/a/1", "/z/0", "/z/1"]
    await store.ack("g", out.lease_id)
    assert (await store.stats("g")).size == 0
    assert await store.client.xlen(store._key("stream")) == 0
