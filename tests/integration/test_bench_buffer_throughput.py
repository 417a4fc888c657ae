"""The buffer benchmark's two sides (`bench/buffer_throughput.py`) on a real redis-server and a real
buffer service process: with acks overlapping the next read and with acks awaited, every experience put
is leased once and acked, and nothing is left pending."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from rft.v1 import buffer_pb2, buffer_pb2_grpc

from bench.buffer_throughput import BATCH, consume_loop, make_batches, run_project, run_raw, start_service
from services.common.rpc import create_channel
from tests.support.redis_server import RedisServer, require_redis_server


async def _stats(address: str) -> buffer_pb2.StatsResponse:
    async with create_channel(address, timeout_s=30) as channel:
        return await buffer_pb2_grpc.BufferServiceStub(channel).Stats(buffer_pb2.StatsRequest(), timeout=10)


def test_both_sides_ack_everything_they_read(tmp_path):
    require_redis_server()
    batches = make_batches(4 * BATCH)
    total = len(batches) * BATCH
    with RedisServer.start() as redis_server:
        proc, port = start_service(redis_server.url, tmp_path)
        address = f"127.0.0.1:{port}"
        try:
            for overlap in (True, False):
                before = asyncio.run(_stats(address))
                assert asyncio.run(run_project(address, batches, overlap=overlap)) > 0
                after = asyncio.run(_stats(address))
                assert after.accepted - before.accepted == total
                assert after.acked - before.acked == total
                assert after.pending_leases == 0 and after.size == 0
                assert asyncio.run(run_raw(redis_server.url, batches, overlap=overlap)) > 0
        finally:
            proc.terminate()
            proc.wait(10)

        async def raw_keys() -> list[bytes]:
            client = aioredis.from_url(redis_server.url)
            try:
                return await client.keys("raw-*")
            finally:
                await client.aclose()

        assert asyncio.run(raw_keys()) == []  # each raw run read, acked and deleted its stream


@pytest.mark.parametrize("overlap", [True, False])
async def test_consume_loop_keeps_at_most_one_ack_in_flight(overlap):
    """`overlap`: a read runs while the previous read's ack is in flight, never two acks at once;
    otherwise no read starts before the previous ack ended."""
    reads = iter([(1, 2), (2, 0), (3, 2), (4, 2)])  # (token, count); a read of 0 is an empty lease
    in_flight: list[int] = []
    seen_during_read: list[list[int]] = []
    acked: list[int] = []

    async def read() -> tuple[int, int]:
        await asyncio.sleep(0)  # ok-sleep: a yield to the loop (no time passes), as a read awaits its reply
        seen_during_read.append(list(in_flight))
        return next(reads)

    async def ack(token: int) -> None:
        in_flight.append(token)
        assert len(in_flight) == 1
        for _ in range(2):  # yields to the loop: a read may run while this ack is open
            await asyncio.sleep(0)  # ok-sleep: a yield (no time passes), not a wait for another task
        in_flight.remove(token)
        acked.append(token)

    await consume_loop(read, ack, total=6, overlap=overlap)
    assert acked == [1, 3, 4]  # the empty read is not acked
    if overlap:
        assert seen_during_read == [[], [1], [], [3]]
    else:
        assert all(not s for s in seen_during_read)
