"""Moving weights: the memory methods' push and pull, and the nccl method's rendezvous, handshake and
group generations. Each SKIPs under a sync_method it does not concern."""

from __future__ import annotations

import asyncio

import grpc
from rft.v1 import common_pb2, synchronizer_pb2

from launcher.conformance.harness import CheckSkipped, check, expect_error, require
from launcher.conformance.synchronizer_context import (
    CALL_TIMEOUT_S,
    EXPLORER,
    TRAINER,
    SyncContext,
    chunks_of,
    safetensors_blob,
    with_members,
)

TENSORS = [
    common_pb2.TensorMeta(name="w", dtype=common_pb2.DTYPE_FLOAT32, shape=[2, 2]),
    common_pb2.TensorMeta(name="b", dtype=common_pb2.DTYPE_FLOAT32, shape=[2]),
]


@check("push_pull_weights")
async def push_pull_weights(ctx: SyncContext) -> str:
    """memory methods only (else SKIP). A PushWeights stream of version P+1 in 3 chunks answers P+1 and the
    payload bytes; PullWeights (latest, and by version) streams the same chunks back: same data, index
    0..2, total 3, version P+1. A version not kept is NOT_FOUND. Broken streams are INVALID_ARGUMENT and
    change nothing: an empty one, a missing chunk, one ending before `total`, chunks of two versions,
    more bytes than `total_bytes`. Pushing P+1 again is FAILED_PRECONDITION (not newer)."""
    if not ctx.pushed:
        raise CheckSkipped(f"sync_method {ctx.method} pushes no weights through the synchronizer")
    published = (await ctx.state()).model_version
    version, step = published.version + 1, published.step + 1
    blob = safetensors_blob(version)
    sent = chunks_of(version, step, blob, 3)
    reply = await ctx.push(sent)
    require(
        reply.model_version.version == version, f"PushWeights answered version {reply.model_version.version}"
    )
    require(
        reply.bytes == len(blob), f"PushWeights answered {reply.bytes} bytes, the stream carried {len(blob)}"
    )
    for asked in (0, version):
        got = await ctx.pull(asked)
        require(
            [(c.index, c.total, c.version.version) for c in got] == [(i, 3, version) for i in range(3)],
            f"PullWeights({asked}) streamed {[(c.index, c.total, c.version.version) for c in got]}",
        )
        require(b"".join(c.data for c in got) == blob, f"PullWeights({asked}) data differs from the pushed")
    await expect_error(
        ctx.pull(version + 1000), grpc.StatusCode.NOT_FOUND, "PullWeights of a version not kept"
    )
    nxt = version + 1
    good = chunks_of(nxt, step + 1, safetensors_blob(nxt), 3)
    other = chunks_of(nxt + 1, step + 1, safetensors_blob(nxt), 3)
    overflow = [common_pb2.WeightChunk(version=c.version, index=c.index, total=c.total, data=c.data + b"x",
                                       total_bytes=c.total_bytes) for c in good]  # fmt: skip
    broken = {
        "an empty stream": [],
        "a missing chunk": [good[0], good[2]],
        "a stream ending before total": good[:2],
        "chunks of two versions": [good[0], other[1], good[2]],
        "more bytes than total_bytes": overflow,
    }
    for what, chunks in broken.items():
        await expect_error(ctx.push(chunks), grpc.StatusCode.INVALID_ARGUMENT, f"PushWeights of {what}")
    require((await ctx.state()).model_version.version == version, "a refused push changed model_version")
    require(b"".join(c.data for c in await ctx.pull()) == blob, "a refused push changed the kept weights")
    await expect_error(
        ctx.push(sent), grpc.StatusCode.FAILED_PRECONDITION, f"pushing version {version} again"
    )
    return f"version {version} pushed and pulled back bit-equal; {len(broken)} broken streams refused"


async def _info(ctx: SyncContext, member_id: str, tensors=()) -> synchronizer_pb2.SyncGroupResponse:
    request = synchronizer_pb2.SyncGroupRequest(member_id=member_id, tensors=list(tensors))
    return await ctx.stub.GetWeightSyncInfo(request, timeout=CALL_TIMEOUT_S)


@check("rendezvous")
async def rendezvous(ctx: SyncContext) -> str:
    """nccl only (else SKIP). With a trainer and explorers A (2 workers) and B (1), GetWeightSyncInfo gives
    the trainer rank 0 and the explorers consecutive ranks in registration order (A 1-2, B 3), world size
    4, one generation (GetRunState's), address and port for all, and every receiver the trainer's tensors.
    B leaving starts a new generation (world size 3). The handshake: while A waits for P+1 (REQUIRE_SYNC),
    the trainer's RequestSync(P+1) is accepted in the current generation and A's WaitForVersion answers
    `receive_broadcast` with version P+1 in it; GetRunState shows the sync in progress; the trainer's
    ReportSync(ok) publishes P+1 and A's ReportSync(ok) shows A holding P+1. A failed broadcast
    (ReportSync ok=false) publishes nothing and starts a new generation; a RequestSync whose receivers
    are not ready within `timeout_ms` is not accepted, with a reason."""
    if not ctx.broadcast:
        raise CheckSkipped(f"sync_method {ctx.method} has no broadcast group")

    async def body() -> str:
        trainer, _ = await ctx.register("rdv-trainer", TRAINER, address="127.0.0.1:1")
        a, _ = await ctx.register("rdv-a", EXPLORER, workers=2)
        b, _ = await ctx.register("rdv-b", EXPLORER, workers=1)
        t_info = await _info(ctx, trainer, TENSORS)
        a_info, b_info = await _info(ctx, a), await _info(ctx, b)
        gen = (await ctx.state()).generation
        require(list(t_info.ranks) == [0], f"the trainer's ranks are {list(t_info.ranks)}, want [0]")
        require((list(a_info.ranks), list(b_info.ranks)) == ([1, 2], [3]),
                f"explorer ranks {list(a_info.ranks)} and {list(b_info.ranks)}, want [1, 2] and [3]")  # fmt: skip
        for who, info in (("trainer", t_info), ("A", a_info), ("B", b_info)):
            g = info.group
            require((g.world_size, g.generation) == (4, gen),
                    f"{who}: world_size {g.world_size} generation {g.generation}, want 4 and {gen}")  # fmt: skip
            require(g.master_address and g.master_port > 0, f"{who}: no rendezvous address/port")
            require((g.master_address, g.master_port) == (t_info.group.master_address, t_info.group.master_port),
                    f"{who} got another rendezvous than the trainer")  # fmt: skip
            require(list(g.tensors) == TENSORS, f"{who} got tensors {[t.name for t in g.tensors]}")
        await ctx.leave(b)
        after = await _info(ctx, a)
        require(after.group.generation > gen, f"B leaving kept generation {gen}")
        require(
            after.group.world_size == 3 and list(after.ranks) == [1, 2], "the rebuilt group is not A 1-2 of 3"
        )
        gen = after.group.generation
        published = (await ctx.state()).model_version
        version, step = published.version + 1, published.step + 1
        waiting = asyncio.ensure_future(ctx.wait(a, 8000, min_version=version))
        try:
            await ctx.until_status(a, common_pb2.MEMBER_STATUS_REQUIRE_SYNC, "A waiting for a version")
            decision = await ctx.request_sync(trainer, step, version=version, timeout_ms=8000)
            told = await asyncio.wait_for(asyncio.shield(waiting), CALL_TIMEOUT_S)
        finally:
            if not waiting.done():
                waiting.cancel()
        require(decision.accepted and decision.generation == gen,
                f"RequestSync with A ready: accepted={decision.accepted} generation {decision.generation} "
                f"({decision.reason!r}), want accepted in {gen}")  # fmt: skip
        require(told.receive_broadcast and told.model_version.version == version and told.generation == gen,
                f"A was told receive_broadcast={told.receive_broadcast} version {told.model_version.version} "
                f"generation {told.generation}")  # fmt: skip
        state = await ctx.state()
        require(
            state.sync_in_progress and state.pending_version == version,
            "GetRunState shows no sync in progress",
        )
        done = await ctx.report(trainer, version, ok=True, generation=gen)
        require(
            done.model_version.version == version,
            f"the trainer's ReportSync(ok) answered {done.model_version.version}",
        )
        await ctx.report(a, version, ok=True, generation=gen)
        require(
            (await ctx.member(a)).model_version == version, "A's ReportSync(ok) did not record its version"
        )
        failed = await ctx.report(
            trainer, version + 1, ok=False, generation=gen, message="conformance: failed"
        )
        require(failed.model_version.version == version, "a failed broadcast published a version")
        require(failed.generation > gen, "a failed broadcast kept the group generation")
        late = await ctx.request_sync(trainer, step + 1, version=version + 1, timeout_ms=300)
        require(
            not late.accepted and late.reason, f"RequestSync with no receiver ready: accepted={late.accepted}"
        )
        return f"ranks, generations, handshake and publish of {version}, failed and late broadcasts"

    return await with_members(ctx, body)
