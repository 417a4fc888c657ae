"""Model versions: monotonic, published the run's way, and what WaitForVersion promises."""

from __future__ import annotations

import asyncio

import grpc
from rft.v1 import common_pb2

from launcher.conformance.harness import check, expect_error, require
from launcher.conformance.synchronizer_context import (
    CALL_TIMEOUT_S,
    EXPLORER,
    TRAINER,
    SyncContext,
    with_members,
)


@check("versions_monotonic")
async def versions_monotonic(ctx: SyncContext) -> str:
    """Publishing version P+1 the run's way (memory: PushWeights; checkpoint: NotifyCheckpoint; nccl: the
    trainer's ReportSync ok) answers P+1 and GetRunState, Heartbeat and Register then answer P+1 with its
    step. Publishing P+1 again (nccl: P, older) or P is FAILED_PRECONDITION and leaves P+1 published.
    checkpoint: a NotifyCheckpoint without `checkpoint_path` is INVALID_ARGUMENT naming it."""

    async def body() -> str:
        old = (await ctx.state()).model_version
        new, step = old.version + 1, old.step + 1
        trainer, _ = await ctx.register("ver-trainer", TRAINER, step=step)  # nccl publishes at its step
        publish = ctx.publisher(trainer)
        answered = await publish(new, step)
        require(answered.version == new, f"publishing version {new} answered {answered.version}")
        state = await ctx.state()
        require(
            (state.model_version.version, state.model_version.step) == (new, step),
            f"GetRunState shows version {state.model_version.version} step {state.model_version.step} after "
            f"publishing {new} at step {step}",
        )
        require(
            (await ctx.heartbeat(trainer)).model_version.version == new,
            "Heartbeat does not answer the new version",
        )
        _, reply = await ctx.register("ver-late", EXPLORER)
        require(reply.model_version.version == new, "Register does not answer the new version")
        stale = [old.version] if ctx.broadcast else [new, old.version]
        for version in stale:
            await expect_error(
                publish(version, step + 1),
                grpc.StatusCode.FAILED_PRECONDITION,
                f"publishing version {version} after {new}",
            )
        require((await ctx.state()).model_version.version == new, "a refused publish changed model_version")
        if not (ctx.pushed or ctx.broadcast):
            request = common_pb2.ModelVersion(version=new + 1, step=step + 1)
            err = await expect_error(
                ctx.stub.NotifyCheckpoint(request, timeout=CALL_TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT,
                "NotifyCheckpoint without checkpoint_path",
            )
            require(
                "checkpoint_path" in (err.details() or ""),
                f"the refusal does not name checkpoint_path: {err.details()!r}",
            )
        return f"{ctx.method}: published {new}; {', '.join(map(str, stale))} refused as stale"

    return await with_members(ctx, body)


@check("wait_for_version")
async def wait_for_version(ctx: SyncContext) -> str:
    """WaitForVersion(min_version <= what the member may have) answers at once, not timed out, with the
    run's `sync_method`; min_version above it with `timeout_ms` 300 answers `timed_out` with
    `required_version` = min_version. While an explorer waits for P+1 it is listed REQUIRE_SYNC, and
    the trainer's RequestSync for version P+1 is accepted whatever the plan says (an explorer waits for
    it); then, except with nccl (whose explorers get only what is broadcast: the `rendezvous` check),
    publishing P+1 ends the wait with version P+1, not timed out."""

    async def body() -> str:
        explorer, _ = await ctx.register("wait", EXPLORER)
        trainer, _ = await ctx.register("wait-trainer", TRAINER)
        published = (await ctx.state()).model_version
        floor = 0 if ctx.broadcast else published.version
        now = await ctx.wait(explorer, 2000, min_version=floor)
        require(not now.timed_out and not now.finished, f"WaitForVersion({floor}) did not answer at once")
        require(
            now.sync_method == ctx.method, f"sync_method {now.sync_method!r}, the run's is {ctx.method!r}"
        )
        want = published.version + 1
        late = await ctx.wait(explorer, 300, min_version=want)
        require(late.timed_out, f"WaitForVersion({want}) with nothing published answered timed_out=False")
        require(late.required_version == want, f"required_version {late.required_version}, want {want}")
        if ctx.broadcast:
            return "answers at once when satisfied, times out when not (nccl release: rendezvous check)"
        waiting = asyncio.ensure_future(ctx.wait(explorer, 8000, min_version=want))
        try:
            await ctx.until_status(explorer, common_pb2.MEMBER_STATUS_REQUIRE_SYNC, "while waiting")
            decision = await ctx.request_sync(trainer, published.step + 1, version=want)
            require(
                decision.accepted,
                f"RequestSync with an explorer waiting for its version: {decision.reason!r}",
            )
            await ctx.publisher(trainer)(want, published.step + 1)
            reply = await asyncio.wait_for(asyncio.shield(waiting), CALL_TIMEOUT_S)
        finally:
            if not waiting.done():
                waiting.cancel()
        require(not reply.timed_out and reply.model_version.version == want,
                f"the waiter answered timed_out={reply.timed_out} version {reply.model_version.version}")  # fmt: skip
        return "answers at once when satisfied, times out when not, a publish releases the waiter"

    return await with_members(ctx, body)
