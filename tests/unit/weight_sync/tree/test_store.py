"""The relay's core (`weight_sync.tree.store`), no network: chunks forwarded as they arrive, resume from
the next source, stalls, bad chunks, deltas only from the held version and of one kind, failure, and
which versions a relay keeps."""

from __future__ import annotations

import asyncio

import pytest

from services.weight_sync import MissingChunkError
from services.weight_sync.tree.store import (
    ChunkCheck,
    RelayBroken,
    RelayStore,
    VersionNotHeld,
    pull_version,
)
from services.weight_sync.wire.chunks import join_raw_chunks, split_chunks


def raws(version: int, n: int = 5, size: int = 100, delta_base: int | None = None) -> list[bytes]:
    payload = bytes((version * 7 + i) % 251 for i in range(n * size))
    return [
        c.SerializeToString() for c in split_chunks(payload, version, chunk_bytes=size, delta_base=delta_base)
    ]


def source_of(chunks, *, fail_after: int | None = None, gate: tuple[int, asyncio.Event] | None = None):
    """A `Source` serving `chunks`; raises after `fail_after`, or waits on `gate` = (index, event)."""

    async def open_stream(version, have=None):
        for i, raw in enumerate(chunks):
            if fail_after is not None and i == fail_after:
                raise ConnectionError("parent died")
            if gate is not None and i == gate[0]:
                await gate[1].wait()
            yield raw

    return open_stream


async def test_a_reader_gets_each_chunk_before_the_next_arrives():
    store, chunks, gate = RelayStore(), raws(1), asyncio.Event()
    pulling = asyncio.ensure_future(pull_version(store, 1, [("p", source_of(chunks, gate=(2, gate)))], 5))
    stream = await store.stream_for(1, wait_s=5)
    got = []
    async for raw in stream.follow():
        got.append(raw)
        if len(got) == 2:
            gate.set()  # only now may the source send chunk 2: the reader saw 0 and 1 before it did
    assert got == chunks and (await pulling).complete
    assert join_raw_chunks(store.latest_complete().chunks)[0].version == 1


async def test_a_failed_source_is_resumed_from_the_next_one_unbroken():
    store, chunks = RelayStore(), raws(3)
    sources = [("parent", source_of(chunks, fail_after=2)), ("grandparent", source_of(chunks))]
    stream = await pull_version(store, 3, sources, stall_s=5)
    assert stream.complete and stream.chunks == chunks
    follower = [raw async for raw in stream.follow()]
    assert follower == chunks


async def test_a_stalled_source_is_dropped_and_a_differing_resume_refused():
    store, chunks, never = RelayStore(), raws(4), asyncio.Event()
    other = raws(4)
    other[1] = raws(9)[1]  # not the bytes already held at chunk 1
    sources = [
        ("stalls", source_of(chunks, gate=(3, never))),
        ("differs", source_of(other)),
        ("root", source_of(chunks)),
    ]
    stream = await pull_version(store, 4, sources, stall_s=0.2)
    assert stream.complete and stream.chunks == chunks


async def test_every_source_failing_breaks_the_stream_for_readers():
    store, chunks = RelayStore(), raws(5)
    gate = asyncio.Event()
    pulling = asyncio.ensure_future(
        pull_version(store, 5, [("a", source_of(chunks, fail_after=3, gate=(1, gate)))], 5)
    )
    stream = await store.stream_for(5, wait_s=5)
    got = []
    with pytest.raises(RelayBroken, match="a: ConnectionError: parent died"):
        async for raw in stream.follow():
            got.append(raw)
            gate.set()
    assert got == chunks[:3] and not (await pulling).complete
    assert store.get(5) is None and store.latest_complete() is None  # a failed stream is dropped


@pytest.mark.parametrize(
    ("chunks", "match"),
    [
        (raws(2, delta_base=1), "a delta from version 1, the puller holds None"),
        ([raws(2)[0], *raws(2, delta_base=1)[1:]], "the stream's chunk 0 was a full payload"),
        ([raws(2)[0], raws(2)[2]], "expected chunk 1, got 2"),
        ([raws(2)[0], raws(3)[1]], "version 2"),
        (raws(2)[:3], "stream ended after 3 of 5"),
    ],
)
async def test_bad_streams_are_refused(chunks, match):
    store = RelayStore()
    stream = await pull_version(store, 2, [("bad", source_of(chunks))], stall_s=5)
    assert not stream.complete and match in stream.error


async def test_a_delta_from_the_held_version_is_taken_and_passed_on_as_it_came():
    store, chunks = RelayStore(), raws(2, delta_base=1)
    stream = await pull_version(store, 2, [("p", source_of(chunks))], 5, have=1)
    assert stream.complete and stream.base == 1 and stream.chunks == chunks
    assert join_raw_chunks(stream.chunks)[1] == 1  # a receiver sees a delta from version 1
    other = await pull_version(RelayStore(), 2, [("p", source_of(chunks))], 5, have=3)
    assert not other.complete and "a delta from version 1, the puller holds 3" in other.error
    full = await pull_version(RelayStore(), 2, [("p", source_of(raws(2)))], 5, have=1)
    assert full.complete and full.base is None  # a full payload is fine whatever the relay held


def test_chunk_check_counts_a_complete_stream():
    check = ChunkCheck(expect=6)
    for raw in raws(6, n=3):
        check.add(raw)
    assert check.complete and (check.count, check.received) == (3, 300)
    with pytest.raises(MissingChunkError, match="asked for version 6"):
        ChunkCheck(expect=6).add(raws(7)[0])


async def test_the_store_keeps_the_newest_complete_version_and_waits_for_a_coming_one():
    store = RelayStore()
    await pull_version(store, 1, [("s", source_of(raws(1)))], 5)
    assert (await store.stream_for(0, wait_s=1)).version == 1
    waiting = asyncio.ensure_future(store.stream_for(2, wait_s=5))
    await asyncio.sleep(0)  # ok-sleep: one loop turn, so the reader waits before version 2 begins
    await pull_version(store, 2, [("s", source_of(raws(2)))], 5)
    assert (await waiting).version == 2
    assert store.get(1) is None and store.latest_complete().version == 2
    with pytest.raises(VersionNotHeld):
        await store.stream_for(1, wait_s=5)  # older than the newest complete: answered at once
    again = await pull_version(store, 2, [], 5)  # already complete: nothing pulled
    assert again is store.get(2)
