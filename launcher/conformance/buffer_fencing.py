"""Fencing with OpenConsumer epochs: a restarted consumer takes over at once; its predecessor is refused."""

from __future__ import annotations

import grpc
from rft.v1 import buffer_pb2

from launcher.conformance.buffer_context import CALL_TIMEOUT_S, BufferContext, ids
from launcher.conformance.harness import check, expect_error, require


@check("fencing")
async def fencing(ctx: BufferContext) -> str:
    """OpenConsumer of a new consumer name answers epoch 1, a second one epoch 2, releasing the first
    epoch's lease (`released` = its experiences) for redelivery at once. A lease taken with an epoch
    never expires (`lease_deadline_ms` = 0). After the newer OpenConsumer the older epoch is refused
    with ABORTED: its Ack, its Nack and its GetBatch. An epoch never handed out (current + 5) is
    NOT_FOUND for GetBatch and for an Ack naming the consumer. The new epoch leases the released group again and acks it (`acked` = 2)."""
    await ctx.drain()
    consumer = ctx.consumer("fenced")
    group = ctx.new_group(2, "fence")
    await ctx.put(group)

    async def open_consumer() -> buffer_pb2.OpenConsumerResponse:
        request = buffer_pb2.OpenConsumerRequest(consumer_group=ctx.group, consumer=consumer)
        return await ctx.stub.OpenConsumer(request, timeout=CALL_TIMEOUT_S)

    first = await open_consumer()
    require(first.epoch == 1, f"the first OpenConsumer of a new name answered epoch {first.epoch}, want 1")
    old = await ctx.get(2, consumer=consumer, epoch=first.epoch)
    require(ctx.own(old) == ids(group), "GetBatch with the epoch did not lease the group put")
    require(
        old.lease_deadline_ms == 0,
        f"a lease taken with an epoch has lease_deadline_ms={old.lease_deadline_ms}",
    )
    second = await open_consumer()
    require(second.epoch == 2, f"the second OpenConsumer answered epoch {second.epoch}, want 2")
    require(second.released == 2, f"the takeover released {second.released} experiences, want the 2 leased")
    stale = {"consumer": consumer, "epoch": first.epoch}
    await expect_error(ctx.ack(old.lease_id, **stale), grpc.StatusCode.ABORTED, "Ack with the older epoch")
    await expect_error(ctx.nack(old.lease_id, **stale), grpc.StatusCode.ABORTED, "Nack with the older epoch")
    await expect_error(ctx.get(2, **stale), grpc.StatusCode.ABORTED, "GetBatch with the older epoch")
    await expect_error(
        ctx.get(2, consumer=consumer, epoch=second.epoch + 5),
        grpc.StatusCode.NOT_FOUND,
        "GetBatch with an epoch never handed out",
    )
    await expect_error(
        ctx.ack(old.lease_id, consumer=consumer, epoch=second.epoch + 5),
        grpc.StatusCode.NOT_FOUND,
        "Ack naming the consumer with an epoch never handed out",
    )
    new = await ctx.get(2, consumer=consumer, epoch=second.epoch)
    require(ctx.own(new) == ids(group), "the new epoch did not get the released group at once")
    acked = await ctx.ack(new.lease_id, consumer=consumer, epoch=second.epoch)
    require(acked == 2, f"Ack with the current epoch answered {acked}, want 2")
    return "the older epoch's Ack/Nack/GetBatch got ABORTED; the new epoch took the lease over at once"


@check("takeover_ack_and_keep")
async def takeover_ack_and_keep(ctx: BufferContext) -> str:
    """OpenConsumer's lists: of three leases taken with epoch 1, a second OpenConsumer with
    `ack_lease_ids` = [first] and `keep_lease_ids` = [second] answers acked = 2 (the first lease's
    experiences) and released = 2 (the third's only); the kept lease is then acked with epoch 2
    (`acked` = 2), the released group is leased again at once, and the acked one is never redelivered."""
    await ctx.drain()
    consumer = ctx.consumer("takeover")
    groups = [ctx.new_group(2, "takeover") for _ in range(3)]
    await ctx.put(*groups)

    async def open_consumer(**lists: list[str]) -> buffer_pb2.OpenConsumerResponse:
        request = buffer_pb2.OpenConsumerRequest(consumer_group=ctx.group, consumer=consumer, **lists)
        return await ctx.stub.OpenConsumer(request, timeout=CALL_TIMEOUT_S)

    first = await open_consumer()
    leases = [await ctx.get(2, consumer=consumer, epoch=first.epoch) for _ in groups]
    for lease, group in zip(leases, groups, strict=True):
        require(ctx.own(lease) == ids(group), "GetBatch(2) with an epoch did not lease the groups in order")
    second = await open_consumer(ack_lease_ids=[leases[0].lease_id], keep_lease_ids=[leases[1].lease_id])
    require(
        (second.acked, second.released) == (2, 2),
        f"OpenConsumer(ack 1 lease, keep 1) answered acked={second.acked} released={second.released}, "
        "want 2 and 2",
    )
    kept = await ctx.ack(leases[1].lease_id, consumer=consumer, epoch=second.epoch)
    require(kept == 2, f"Ack of the kept lease with the new epoch answered {kept}, want 2")
    again = await ctx.get(6, consumer=consumer, epoch=second.epoch)
    got = ctx.own(again)
    require(
        got == ids(groups[2]), f"after the takeover GetBatch(6) leased {got}, want only the released group"
    )
    await ctx.ack(again.lease_id, consumer=consumer, epoch=second.epoch)
    return "ack_lease_ids were acked, keep_lease_ids stayed held under the new epoch, the rest came back"
