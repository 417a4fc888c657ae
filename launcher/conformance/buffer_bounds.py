"""Bounds on what a request carries: INVALID_ARGUMENT whose message starts with the field's name and
shows at most 64 characters of the value (so a refusal never outgrows a client's message limit)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from rft.v1 import buffer_pb2

from launcher.conformance.buffer_context import CALL_TIMEOUT_S, BufferContext
from launcher.conformance.harness import check, expect_error, refused


@check("bounds_strings")
async def bounds_strings(ctx: BufferContext) -> str:
    """Strings over their bound are INVALID_ARGUMENT naming the field, in a message of at most 512
    characters showing at most 64 of the value: Ack and Nack with a 10,000-character `lease_id`, GetBatch
    with a 129-character `consumer` and a 65-character `consumer_group`, Put with a 129-character
    `producer_id`; `min_model_version` = 2^31 is INVALID_ARGUMENT naming it. A 128-character `lease_id`
    is within the bound: its Ack is FAILED_PRECONDITION (an unknown lease), not INVALID_ARGUMENT."""
    long_id = "L" * 10_000
    await refused(ctx.ack(long_id), "lease_id", long_id)
    await refused(ctx.nack(long_id), "lease_id", long_id)
    await refused(ctx.get(1, consumer="c" * 129), "consumer", "c" * 129)
    group = "g" * 65
    request = buffer_pb2.GetBatchRequest(consumer_group=group, size=1)
    await refused(ctx.stub.GetBatch(request, timeout=CALL_TIMEOUT_S), "consumer_group", group)
    batch = ctx.batch(ctx.new_group(1, "bounds"))
    batch.producer_id = "p" * 129
    await refused(ctx.stub.Put(batch, timeout=CALL_TIMEOUT_S), "producer_id", batch.producer_id)
    await refused(ctx.get(1, min_model_version=2**31), "min_model_version")
    await expect_error(
        ctx.ack(f"cf-{ctx.tag}".ljust(128, "0")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "Ack of an unknown 128-character lease_id (within the bound)",
    )
    return "lease_id, consumer, consumer_group, producer_id, min_model_version refused by name, briefly"


@check("bounds_lists")
async def bounds_lists(ctx: BufferContext) -> str:
    """OpenConsumer's id lists are bounded: an `ack_lease_ids` entry of 129 characters is INVALID_ARGUMENT
    starting `ack_lease_ids[1]` (its index), an empty `keep_lease_ids` entry one starting
    `keep_lease_ids`, and 65,537 `ack_lease_ids` entries one starting `ack_lease_ids`."""
    consumer = ctx.consumer("bounds")

    def open_consumer(**lists: list[str]) -> Callable[[], Awaitable]:
        request = buffer_pb2.OpenConsumerRequest(consumer_group=ctx.group, consumer=consumer, **lists)
        return ctx.stub.OpenConsumer(request, timeout=CALL_TIMEOUT_S)

    await refused(open_consumer(ack_lease_ids=["a" * 32, "x" * 129]), "ack_lease_ids[1]", "x" * 129)
    await refused(open_consumer(keep_lease_ids=[""]), "keep_lease_ids")
    await refused(open_consumer(ack_lease_ids=["a"] * 65_537), "ack_lease_ids")
    return "over-long, empty and too many lease ids refused with the field and index"
