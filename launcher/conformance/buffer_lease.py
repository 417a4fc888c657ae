"""Whole-group leasing and what `GetBatchRequest.size` means."""

from __future__ import annotations

from launcher.conformance.buffer_context import BufferContext, ids
from launcher.conformance.harness import CheckFailed, check, require


@check("lease_whole_groups")
async def lease_whole_groups(ctx: BufferContext) -> str:
    """A group (experiences of one put batch sharing `eid.group_id`) is never split, and a lease is the run
    of whole groups, in store order, whose sizes add up to at most `size`, a first group larger than
    `size` alone. With groups A(4), B(4) in one batch and C(3), D(3) in a second: GetBatch(size=2) leases
    exactly A (members in put order, `partial` false); GetBatch(4) leases B; GetBatch(4, timeout 300 ms)
    leases C alone (C + D = 6 > 4) with `partial` true; GetBatch(3) leases D; unfenced leases carry a
    deadline (`lease_deadline_ms` > 0)."""
    await ctx.drain()
    a, b = ctx.new_group(4, "lease"), ctx.new_group(4, "lease")
    c, d = ctx.new_group(3, "lease"), ctx.new_group(3, "lease")
    await ctx.put(a, b)
    await ctx.put(c, d)
    steps = [(2, 0, a, False, "size 2 with groups of 4"), (4, 0, b, False, "size 4 with groups of 4")]
    steps += [(4, 300, c, True, "size 4 with groups of 3"), (3, 0, d, False, "size 3 with groups of 3")]
    for size, timeout_ms, want, partial, what in steps:
        lease = await ctx.get(size, timeout_ms=timeout_ms)
        got = ctx.own(lease)
        if got != ids(want):
            split = {g.split("/")[0] for g in got}
            raise CheckFailed(
                f"{what}: leased {len(got)} experiences of {len(split)} groups, want the {len(want)} of one "
                "whole group in put order"
            )
        require(lease.partial == partial, f"{what}: partial={lease.partial}, want {partial}")
        require(lease.lease_deadline_ms > 0, f"{what}: an unfenced lease has lease_deadline_ms=0")
        await ctx.ack(lease.lease_id)
    return "size 2 leased a whole group of 4, size 4 leased one group of 3 (partial); no group was split"
