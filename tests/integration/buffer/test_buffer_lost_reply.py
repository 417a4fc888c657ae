"""A GetBatch whose reply is lost (the buffer dies after leasing, before answering) must surface to the
consumer, not be retried by gRPC: a silent retry leases a second batch while the first stays leased to
a consumer that never saw it (fenced leases never expire), so a strictly on-policy run waits for that
data forever. Real grpc.aio server on port 0, both stores; the lost reply is an UNAVAILABLE after the
lease was made, which is what the client sees when the server's process dies at that moment."""

from __future__ import annotations

import grpc
from rft.v1 import buffer_pb2

from services.buffer.core import BufferCore
from services.buffer.servicer import SERVICE_NAME, BufferServicer, add_to_server
from services.buffer.settings import BufferSettings
from services.common.buffer_client import BufferClient
from services.common.lineage import experience_uid
from services.common.rpc import create_channel, start_server
from tests.support.buffer_data import batch, group


class LosesFirstReply(BufferServicer):
    """The real servicer, except that the first GetBatch that leased something never answers."""

    def __init__(self, core: BufferCore):
        super().__init__(core)
        self.calls = 0

    async def GetBatch(self, request: buffer_pb2.GetBatchRequest, context: grpc.aio.ServicerContext):
        self.calls += 1
        reply = await super().GetBatch(request, context)
        if self.calls == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost after the lease")
        return reply


async def test_a_lost_lease_reply_comes_back_to_the_consumer_and_no_second_lease_hides_it(store_factory):
    store = await store_factory(consumer_groups=("default",))
    servicer = LosesFirstReply(BufferCore(store, BufferSettings()))
    handle = await start_server([(add_to_server, servicer, SERVICE_NAME)])
    channel = create_channel(handle.address, timeout_s=10)
    try:
        client = BufferClient(channel, producer_id="p", consumer_group="default", consumer="trainer")
        first, second = group("a", 2), group("b", 2)
        await client.put_proto(batch(first, second))
        await client.open_consumer()
        got = await client.get_batch(2, timeout_ms=200)
        # the client saw the failure, opened again (holding nothing) and was given the lost lease's data
        assert [experience_uid(e.eid) for e in got.decoded()] == [experience_uid(e.eid) for e in first]
        stats = await client.stats()
        assert (stats.pending_leases, stats.pending_experiences) == (1, 2), stats
        assert await client.ack(got.lease_id) == 2
        rest = await client.get_batch(2, timeout_ms=200)
        assert [experience_uid(e.eid) for e in rest.decoded()] == [experience_uid(e.eid) for e in second]
    finally:
        await channel.close()
        await handle.stop(0)
