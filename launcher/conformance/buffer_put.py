"""Exactly-once put. `Put`/`PutExperiences` promise no deduplication by experience id (a batch put twice
is stored twice); the idempotent form is `PutSequenced`, keyed by (producer_id, sequence)."""

from __future__ import annotations

from rft.v1 import buffer_pb2

from launcher.conformance.buffer_context import CALL_TIMEOUT_S, BufferContext, ids
from launcher.conformance.harness import check, require


@check("put_exactly_once")
async def put_exactly_once(ctx: BufferContext) -> str:
    """PutSequenced of one batch (producer_id, sequence s) sent twice stores it once: the first reply has
    accepted = n, duplicates = 0; the retry accepted = 0, duplicates = 1, batches = 1; an older sequence
    (s - 1 after s) is a duplicate too. The suite's group then leases the batch's experiences exactly once:
    one GetBatch returns them, the next finds nothing of them."""
    await ctx.drain()
    group = ctx.new_group(3, "put")
    first_seq = ctx.next_sequence()
    seq = ctx.next_sequence()
    batch = ctx.batch(group)
    batch.producer_id = ctx.producer
    request = buffer_pb2.SequencedBatch(batch=batch, sequence=seq)
    first = await ctx.stub.PutSequenced(request, timeout=CALL_TIMEOUT_S)
    require(
        (first.accepted, first.duplicates) == (3, 0),
        f"first PutSequenced: accepted={first.accepted} duplicates={first.duplicates}, want 3 and 0",
    )
    again = await ctx.stub.PutSequenced(request, timeout=CALL_TIMEOUT_S)
    require(
        (again.accepted, again.duplicates, again.batches) == (0, 1, 1),
        f"repeated PutSequenced: accepted={again.accepted} duplicates={again.duplicates} "
        f"batches={again.batches}, want 0, 1, 1",
    )
    older = await ctx.stub.PutSequenced(
        buffer_pb2.SequencedBatch(batch=batch, sequence=first_seq), timeout=CALL_TIMEOUT_S
    )
    require(
        (older.accepted, older.duplicates) == (0, 1),
        f"PutSequenced with an older sequence: accepted={older.accepted} duplicates={older.duplicates}, "
        "want 0 and 1",
    )
    lease = await ctx.get(6)
    got = ctx.own(lease)
    require(got == ids(group), f"GetBatch(6) after the retries leased {len(got)} experiences, want the 3 put")
    await ctx.ack(lease.lease_id)
    rest = await ctx.get(6)
    require(not rest.lease_id, f"a second copy was stored: another {len(rest.experiences)} leased")
    return "a retried or older (producer_id, sequence) is a duplicate; the batch was stored and leased once"
