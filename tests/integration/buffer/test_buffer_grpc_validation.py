"""The buffer servicer on a real grpc.aio server (port 0, both stores): every kind of bad batch is
refused with INVALID_ARGUMENT naming the field and index, nothing of it is stored; a hypothesis
property test throws random malformed batches and checks the store is unchanged. Also the happy path,
RESOURCE_EXHAUSTED on a full buffer, FAILED_PRECONDITION on a bad lease, and the Prometheus view."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from rft.v1 import buffer_pb2, buffer_pb2_grpc

from services.buffer.core import BufferCore
from services.buffer.metrics import BufferCollector
from services.buffer.servicer import registration
from services.buffer.settings import BufferSettings
from services.buffer.validation import Limits
from services.common.buffer_client import BufferClient
from services.common.rpc import create_channel, start_server
from tests.support.buffer_data import batch, group


@pytest.fixture
async def served(store_factory):
    store = await store_factory(capacity=40, consumer_groups=("default",))
    core = BufferCore(store, BufferSettings(limits=Limits(max_batch_experiences=16, max_batch_bytes=20_000)))
    handle = await start_server([registration(core)])
    channel = create_channel(handle.address, timeout_s=10)
    core.channel = channel  # for tests that build a BufferClient on the same channel
    yield core, buffer_pb2_grpc.BufferServiceStub(channel)
    await channel.close()
    await handle.stop(0)


def good():
    return batch(group("a", 2), group("b", 2), vocab_size=1000)


# Mutators that break one field of experience 1 of a good batch, with the field the error must name.
BAD = {
    "negative token": (lambda b: b.experiences[1].tokens.__setitem__(2, -1), "experiences[1].tokens[2]"),
    "token >= vocab": (lambda b: b.experiences[1].tokens.__setitem__(0, 1000), "experiences[1].tokens[0]"),
    "empty tokens": (lambda b: b.experiences[1].ClearField("tokens"), "experiences[1].tokens"),
    "prompt_length too long": (
        lambda b: setattr(b.experiences[1], "prompt_length", 8),
        "experiences[1].prompt_length",
    ),
    "prompt_length negative": (
        lambda b: setattr(b.experiences[1], "prompt_length", -1),
        "experiences[1].prompt_length",
    ),
    "logprobs length": (lambda b: b.experiences[1].logprobs.append(-0.5), "experiences[1].logprobs"),
    "action_mask length": (lambda b: b.experiences[1].action_mask.append(True), "experiences[1].action_mask"),
    "token_level_rewards length": (
        lambda b: b.experiences[1].token_level_rewards.extend([0.0]),
        "experiences[1].token_level_rewards",
    ),
    "nan logprob": (
        lambda b: b.experiences[1].logprobs.__setitem__(3, math.nan),
        "experiences[1].logprobs[3]",
    ),
    "inf logprob": (
        lambda b: b.experiences[1].logprobs.__setitem__(0, -math.inf),
        "experiences[1].logprobs[0]",
    ),
    "nan reward": (lambda b: setattr(b.experiences[1], "reward", math.nan), "experiences[1].reward"),
    "inf reward": (lambda b: setattr(b.experiences[1], "reward", math.inf), "experiences[1].reward"),
    "negative model_version": (
        lambda b: setattr(b.experiences[1], "model_version", -2),
        "experiences[1].model_version",
    ),
    "rejected token >= vocab": (
        lambda b: b.experiences[1].rejected_tokens.extend([1, 2, 5000]),
        "experiences[1].rejected_tokens[2]",
    ),
    "too many experiences": (lambda b: b.experiences.extend(group("c", 13)), "experiences: 17 experiences"),
    "too many bytes": (lambda b: setattr(b.experiences[1], "prompt_text", "x" * 30_000), "batch: "),
    "negative vocab_size": (lambda b: setattr(b, "vocab_size", -5), "vocab_size"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
async def test_bad_batch_refused_whole_with_field_named(served, kind):
    core, stub = served
    mutate, field = BAD[kind]
    bad = good()
    mutate(bad)
    before = await core.stats("default")
    for call in (stub.Put, lambda b, **kw: stub.PutExperiences(iter([b]), **kw)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(bad, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in err.value.details(), err.value.details()
    after = await core.stats("default")
    assert after.size == before.size == 0 and after.accepted == 0
    assert after.rejected == before.rejected + 2 * len(bad.experiences)


async def test_logprobs_message_names_lengths(served):
    _, stub = served
    bad = good()
    bad.experiences[3].logprobs.extend([-1.0, -1.0, -1.0])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Put(bad, timeout=5)
    assert err.value.details() == "experiences[3].logprobs: length 7 != response length 4"


async def test_stream_refuses_bad_batch_keeps_earlier_good_ones(served):
    core, stub = served
    bad = good()
    bad.experiences[0].tokens[0] = -3
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PutExperiences(iter([good(), bad]), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "batches[1].experiences[0].tokens[0]" in err.value.details()
    assert (await core.stats("")).size == 4  # the first batch was good and stored whole


async def test_put_get_ack_round_trip_and_errors(served):
    core, stub = served
    resp = await stub.PutExperiences(iter([good(), good()]), timeout=5)
    assert resp.accepted == 8 and resp.batches == 2
    got = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=4, timeout_ms=100), timeout=5)
    assert [e.eid.group_id for e in got.experiences] == ["a", "a", "b", "b"]
    assert got.experiences[0] == good().experiences[0]
    assert not got.partial and got.lease_deadline_ms > 0
    assert (await stub.Ack(buffer_pb2.AckRequest(lease_id=got.lease_id), timeout=5)).acked == 4
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Nack(buffer_pb2.NackRequest(lease_id=got.lease_id), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetBatch(buffer_pb2.GetBatchRequest(size=0), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "size" in err.value.details()
    stats = await stub.Stats(buffer_pb2.StatsRequest(), timeout=5)
    assert stats.size == 4 and stats.acked == 4 and stats.accepted == 8 and stats.per_model_version == {0: 4}


async def test_full_buffer_is_resource_exhausted(served):
    _, stub = served
    for _ in range(10):
        await stub.Put(good(), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Put(good(), timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_client_sequenced_put_and_metrics(served):
    core, stub = served
    client = BufferClient(core.channel, producer_id="x")
    assert (await client.put_proto(good())).accepted == 4
    again = good()
    again.producer_id = "x"
    dup = await stub.PutSequenced(buffer_pb2.SequencedBatch(batch=again, sequence=1), timeout=5)
    assert dup.accepted == 0 and dup.duplicates == 1  # a retry of sequence 1 stores nothing
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PutSequenced(buffer_pb2.SequencedBatch(batch=good(), sequence=2), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "producer_id" in err.value.details()
    leased = await client.get_batch(4, timeout_ms=0)
    assert len(leased.decoded()) == 4
    assert await client.ack(leased.lease_id) == 4
    registry = CollectorRegistry()
    registry.register(BufferCollector(core, asyncio.get_running_loop()))
    text = (await asyncio.to_thread(generate_latest, registry)).decode()
    assert 'rft_buffer_acked_total{consumer_group="default",store="' in text
    assert "rft_buffer_accepted_total" in text and "rft_buffer_size" in text


malformed = st.sampled_from(sorted(BAD))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(malformed, min_size=1, max_size=4, unique=True),
    position=st.integers(0, 3),
    extra=st.integers(0, 3),
)
async def test_property_malformed_batches_leave_store_unchanged(served, kinds, position, extra):
    core, stub = served
    before = await core.stats("default")
    bad = batch(*[group(f"h{i}", 1) for i in range(extra)], good().experiences, vocab_size=1000)
    applied = 0
    for kind in kinds:
        mutate, _ = BAD[kind]
        try:
            mutate(bad)
            applied += 1
        except IndexError:  # an earlier mutation emptied the array this one edits
            pass
    assume(applied > 0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Put(bad, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = await core.stats("default")
    assert (after.size, after.accepted, after.per_model_version) == (
        before.size,
        before.accepted,
        before.per_model_version,
    )
