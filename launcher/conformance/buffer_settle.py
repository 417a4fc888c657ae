"""Settling a lease: Ack is idempotent, Nack gives the batch back first, an expired lease comes back."""

from __future__ import annotations

import time

import grpc

from launcher.conformance.buffer_context import BufferContext, ids
from launcher.conformance.harness import CheckFailed, check, expect_error, require

SHORT_LEASE_MS = 300
EXPIRY_DEADLINE_S = 20.0
POLL_MS = 250


@check("ack_idempotent")
async def ack_idempotent(ctx: BufferContext) -> str:
    """Ack of a lease answers `acked` = its experiences; repeating the Ack (a retry after a lost reply)
    answers the same count again, twice over, and never redelivers: the group then leases nothing of
    it. A Nack of the acked lease is FAILED_PRECONDITION (it is settled)."""
    await ctx.drain()
    group = ctx.new_group(2, "ack")
    await ctx.put(group)
    lease = await ctx.get(2)
    require(ctx.own(lease) == ids(group), f"GetBatch(2) leased {len(lease.experiences)} experiences, want 2")
    counts = [await ctx.ack(lease.lease_id) for _ in range(3)]
    require(counts == [2, 2, 2], f"Ack, Ack, Ack of one lease of 2 answered {counts}, want [2, 2, 2]")
    await expect_error(
        ctx.nack(lease.lease_id), grpc.StatusCode.FAILED_PRECONDITION, "Nack of an acked lease"
    )
    rest = await ctx.get(2)
    require(not rest.lease_id, f"an acked batch was delivered again ({len(rest.experiences)} experiences)")
    return "a repeated Ack answered its count (2) again; nothing was redelivered"


@check("redelivery_after_nack")
async def redelivery_after_nack(ctx: BufferContext) -> str:
    """Nack of a lease answers `returned` = its experiences, and the next GetBatch of the group leases
    them again first (before a group put after them), members in their order. A second Nack of the same
    lease, and an Ack of it, are FAILED_PRECONDITION (Nack is not idempotent; the lease is settled)."""
    await ctx.drain()
    x, y = ctx.new_group(2, "nack"), ctx.new_group(2, "nack")
    await ctx.put(x, y)
    lease = await ctx.get(2)
    require(ctx.own(lease) == ids(x), "GetBatch(2) did not lease the first group put")
    returned = await ctx.nack(lease.lease_id)
    require(returned == 2, f"Nack of a lease of 2 answered returned={returned}")
    await expect_error(ctx.nack(lease.lease_id), grpc.StatusCode.FAILED_PRECONDITION, "a second Nack")
    await expect_error(ctx.ack(lease.lease_id), grpc.StatusCode.FAILED_PRECONDITION, "Ack of a nacked lease")
    again = await ctx.get(2)
    got = ctx.own(again)
    require(got == ids(x), f"after the Nack GetBatch(2) leased {got}, want the nacked group {ids(x)} first")
    require(again.lease_id != lease.lease_id, "the redelivery reused the nacked lease id")
    await ctx.ack(again.lease_id)
    last = await ctx.get(2)
    require(ctx.own(last) == ids(y), "the group put after the nacked one was not delivered next")
    await ctx.ack(last.lease_id)
    return "the nacked group came back first, in order, under a new lease; a second Nack was refused"


@check("redelivery_after_expiry")
async def redelivery_after_expiry(ctx: BufferContext) -> str:
    """An unfenced lease taken with `lease_ms` = 300 has a deadline (`lease_deadline_ms` > 0); after it
    the group's GetBatch leases the same experiences again (polled with GetBatch waits of 250 ms, all
    within 20 s), and an Ack or Nack of the expired lease is FAILED_PRECONDITION saying it expired."""
    await ctx.drain()
    group = ctx.new_group(2, "expiry")
    await ctx.put(group)
    lease = await ctx.get(2, lease_ms=SHORT_LEASE_MS)
    require(ctx.own(lease) == ids(group), "GetBatch(2) did not lease the group put")
    require(lease.lease_deadline_ms > 0, "an unfenced lease has lease_deadline_ms=0")
    deadline = time.monotonic() + EXPIRY_DEADLINE_S
    again = None
    while time.monotonic() < deadline:
        reply = await ctx.get(2, timeout_ms=POLL_MS)
        if reply.lease_id:
            again = reply
            break
    if again is None:
        raise CheckFailed(f"a {SHORT_LEASE_MS} ms lease was not redelivered within {EXPIRY_DEADLINE_S:.0f} s")
    require(
        ctx.own(again) == ids(group), "after expiry GetBatch leased other experiences than the expired ones"
    )
    for verb, call in (("Ack", ctx.ack), ("Nack", ctx.nack)):
        err = await expect_error(
            call(lease.lease_id), grpc.StatusCode.FAILED_PRECONDITION, f"{verb} of an expired lease"
        )
        require(
            "expire" in (err.details() or "").lower(), f"{verb} of an expired lease does not say it expired"
        )
    require(await ctx.ack(again.lease_id) == 2, "Ack of the redelivered lease did not answer 2")
    return f"a {SHORT_LEASE_MS} ms lease came back after its deadline; its Ack/Nack said it expired"
