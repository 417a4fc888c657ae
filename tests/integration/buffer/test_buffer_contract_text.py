"""What `buffer.proto` promises a client, checked on a real grpc.aio server over both stores (a real
redis-server for the Redis one): bounds on every string and list a request carries (INVALID_ARGUMENT naming
the field, and a refusal that stays short however long the input), an expired lease reported as expired,
an epoch newer than the consumer's current one reported as never handed out (not stale), the range of
`min_model_version`, what `size` means for whole groups, ack idempotency and fenced leases' deadline 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import grpc
import pytest
from rft.v1 import buffer_pb2, buffer_pb2_grpc

from services.buffer.core import MAX_MIN_MODEL_VERSION
from services.buffer.service import build_core
from services.buffer.servicer import registration
from services.common.config import load_config
from services.common.rpc import create_channel, start_server
from tests.support.buffer_data import batch, group

# An error message shows at most 64 characters of a client's value; the rest of it is short.
SHORT = 400


@pytest.fixture(params=["memory", "redis"])
def kind(request):
    return request.param


@contextlib.asynccontextmanager
async def _served(request: pytest.FixtureRequest, kind: str, lease_ms: int = 600_000):
    buffer: dict = {"store": kind, "lease_ms": lease_ms}
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        buffer |= {"redis_url": server.url, "stream_prefix": f"t-{uuid.uuid4().hex[:8]}"}
    core = build_core(load_config(text=json.dumps({"services": {"buffer": buffer}})))
    await core.start()
    handle = await start_server([registration(core)])
    channel = create_channel(handle.address, timeout_s=10)  # the client's default limits
    try:
        yield buffer_pb2_grpc.BufferServiceStub(channel)
    finally:
        await channel.close()
        await handle.stop(0)
        await core.close()


async def _status(call, code: grpc.StatusCode, *texts: str, absent: tuple[str, ...] = ()) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    details = err.value.details() or ""
    assert err.value.code() == code, details[:500]
    assert len(details) < SHORT, f"{len(details)} characters: {details[:200]}..."
    for text in texts:
        assert text in details, details
    for text in absent:
        assert text not in details, details
    return details


async def test_a_huge_lease_id_is_refused_naming_the_field_in_a_short_message(request, kind):
    async with _served(request, kind) as stub:
        huge = "L" * 10_000
        await _status(stub.Ack(buffer_pb2.AckRequest(lease_id=huge)), grpc.StatusCode.INVALID_ARGUMENT,
                      "lease_id", "10000 characters", "128")  # fmt: skip
        await _status(stub.Nack(buffer_pb2.NackRequest(lease_id=huge)), grpc.StatusCode.INVALID_ARGUMENT,
                      "lease_id", "10000 characters")  # fmt: skip
        # at the bound, an unknown id is FAILED_PRECONDITION, shown cut to 64 characters with its length
        at_bound = "k" * 128
        details = await _status(stub.Ack(buffer_pb2.AckRequest(lease_id=at_bound)),
                                grpc.StatusCode.FAILED_PRECONDITION, "(128 characters)", "unknown")  # fmt: skip
        assert at_bound not in details


async def test_every_string_and_list_of_a_request_is_bounded(request, kind):
    long_name, long_group = "c" * 129, "g" * 65
    async with _served(request, kind) as stub:
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        await stub.Put(batch(group("a", 2), vocab_size=1000))
        checks = [
            (stub.GetBatch(buffer_pb2.GetBatchRequest(size=2, consumer=long_name)), "consumer"),
            (stub.GetBatch(buffer_pb2.GetBatchRequest(size=2, consumer_group=long_group)), "consumer_group"),
            (stub.Ack(buffer_pb2.AckRequest(lease_id="x", consumer=long_name)), "consumer"),
            (stub.Nack(buffer_pb2.NackRequest(lease_id="x", consumer_group=long_group)), "consumer_group"),
            (stub.Stats(buffer_pb2.StatsRequest(consumer_group="s" * 10_000)), "consumer_group"),
            (stub.OpenConsumer(buffer_pb2.OpenConsumerRequest(consumer=long_name)), "consumer"),
            (stub.Put(batch(group("b", 2), producer_id="p" * 129)), "producer_id"),
        ]
        sequenced = buffer_pb2.SequencedBatch(batch=batch(group("b", 2), producer_id="p" * 129), sequence=1)
        checks.append((stub.PutSequenced(sequenced), "batch.producer_id"))
        stream = stub.PutExperiences(
            iter([batch(group("c", 2)), batch(group("d", 2), producer_id="p" * 129)])
        )
        checks.append((stream, "batches[1].producer_id"))
        for call, field in checks:
            details = await _status(call, invalid, field, "over the limit")
            assert details.startswith(field + ":"), details
        ids_of = buffer_pb2.OpenConsumerRequest
        await _status(stub.OpenConsumer(ids_of(consumer="t", ack_lease_ids=["a"] * 65_537)), invalid,
                      "ack_lease_ids", "65537 entries")  # fmt: skip
        await _status(stub.OpenConsumer(ids_of(consumer="t", keep_lease_ids=["a", "b" * 129])), invalid,
                      "keep_lease_ids[1]", "129 characters")  # fmt: skip
        # the refused calls changed nothing; of the stream, the batch before the refused one was stored
        stats = await stub.Stats(buffer_pb2.StatsRequest())
        assert stats.size == 4 and stats.pending_leases == 0
        at_bound = buffer_pb2.GetBatchRequest(size=4, consumer="c" * 128)
        assert len((await stub.GetBatch(at_bound)).experiences) == 4


async def test_an_expired_lease_is_reported_as_expired(request, kind):
    async with _served(request, kind) as stub:
        await stub.Put(batch(group("a", 2), group("b", 2), vocab_size=1000))
        first = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=2, lease_ms=1))
        second = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=2, lease_ms=1))
        assert first.lease_deadline_ms > 0 and second.lease_deadline_ms > 0
        end = time.monotonic() + 10
        while (await stub.Stats(buffer_pb2.StatsRequest())).pending_leases:  # Stats expires due leases
            assert time.monotonic() < end, "the leases did not expire within 10 s"
            await asyncio.sleep(0.01)  # ok-sleep: polling the lease expiry with a deadline
        for call in (stub.Ack(buffer_pb2.AckRequest(lease_id=first.lease_id)),
                     stub.Nack(buffer_pb2.NackRequest(lease_id=second.lease_id))):  # fmt: skip
            await _status(
                call, grpc.StatusCode.FAILED_PRECONDITION, "expired", "redelivery", absent=("unknown",)
            )
        await _status(stub.Ack(buffer_pb2.AckRequest(lease_id="never-made")), grpc.StatusCode.FAILED_PRECONDITION,
                      "unknown", absent=("expired",))  # fmt: skip
        again = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=4))
        assert len(again.experiences) == 4  # both went back for redelivery


async def test_a_future_epoch_is_never_handed_out_not_stale(request, kind):
    async with _served(request, kind) as stub:
        await stub.Put(batch(group("a", 2), group("b", 2), vocab_size=1000))
        first = (await stub.OpenConsumer(buffer_pb2.OpenConsumerRequest(consumer="t"))).epoch
        current = (await stub.OpenConsumer(buffer_pb2.OpenConsumerRequest(consumer="t"))).epoch
        assert current == first + 1
        future = current + 5
        await _status(stub.GetBatch(buffer_pb2.GetBatchRequest(size=2, consumer="t", epoch=future)),
                      grpc.StatusCode.NOT_FOUND, f"epoch {future} was never handed out", f"current epoch is {current}",
                      "OpenConsumer", absent=("stale",))  # fmt: skip
        leased = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=2, consumer="t", epoch=current))
        assert leased.lease_deadline_ms == 0  # a fenced lease never expires
        await _status(stub.Ack(buffer_pb2.AckRequest(lease_id=leased.lease_id, consumer="t", epoch=future)),
                      grpc.StatusCode.NOT_FOUND, "never handed out", absent=("stale",))  # fmt: skip
        # without the consumer's name, the lease's own epoch decides; it is not called stale either
        await _status(stub.Ack(buffer_pb2.AckRequest(lease_id=leased.lease_id, epoch=future)),
                      grpc.StatusCode.ABORTED, f"taken with epoch {current}, not {future}",
                      absent=("stale", "newer consumer"))  # fmt: skip
        # an older epoch is stale, and says which one took over
        await _status(stub.GetBatch(buffer_pb2.GetBatchRequest(size=2, consumer="t", epoch=first)),
                      grpc.StatusCode.ABORTED, f"epoch {first} is stale", f"epoch {current}")  # fmt: skip
        ack = buffer_pb2.AckRequest(lease_id=leased.lease_id, consumer="t", epoch=current)
        assert (await stub.Ack(ack)).acked == 2
        assert (await stub.Ack(ack)).acked == 2  # a repeated Ack answers its count again


async def test_min_model_version_bound(request, kind):
    async with _served(request, kind) as stub:
        await stub.Put(batch(group("a", 2, model_version=3), vocab_size=1000))
        for bad in (1 << 31, MAX_MIN_MODEL_VERSION + 1):
            await _status(stub.GetBatch(buffer_pb2.GetBatchRequest(size=2, min_model_version=bad)),
                          grpc.StatusCode.INVALID_ARGUMENT, "min_model_version", str(bad))  # fmt: skip
        stats = await stub.Stats(buffer_pb2.StatsRequest())
        assert stats.size == 2 and stats.dropped_stale == 0  # the backlog is intact
        at_bound = await stub.GetBatch(
            buffer_pb2.GetBatchRequest(size=2, min_model_version=MAX_MIN_MODEL_VERSION)
        )
        assert not at_bound.experiences and at_bound.dropped_stale == 2 and at_bound.partial


async def test_size_counts_whole_groups(request, kind):
    """The batch is the run of whole groups, in serving order, whose sizes sum to at most `size`; a first
    group larger than `size` goes alone. It is returned at once when it holds `size` experiences or more,
    else after `timeout_ms` (partial)."""
    async with _served(request, kind) as stub:
        await stub.Put(batch(group("big", 4), group("x", 3), group("y", 3), group("z", 2), vocab_size=1000))
        big = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=2))  # never split: 4 > size
        assert len(big.experiences) == 4 and not big.partial
        start = time.monotonic()
        three = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=4, timeout_ms=300))  # 3 + 3 > 4
        assert len(three.experiences) == 3 and three.partial and time.monotonic() - start >= 0.25
        rest = await stub.GetBatch(
            buffer_pb2.GetBatchRequest(size=5, timeout_ms=10_000)
        )  # 3 + 2 = 5: at once
        assert [len(rest.experiences), rest.partial] == [5, False]
        assert time.monotonic() - start < 8
        for lease in (big, three, rest):
            await stub.Ack(buffer_pb2.AckRequest(lease_id=lease.lease_id))
