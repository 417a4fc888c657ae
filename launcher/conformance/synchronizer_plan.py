"""The sync plan (synchronizer.proto, "Sync plan"): which version an explorer must hold before a step, and
after which trainer steps the trainer publishes, for the run's `sync_style`, `sync_interval` (I) and
`sync_offset` (K) as GetRunState reports them."""

from __future__ import annotations

from launcher.conformance.harness import CheckFailed, check, require
from launcher.conformance.synchronizer_context import (
    EXPLORER,
    TRAINER,
    SyncContext,
    with_members,
)

STYLES = ("fixed", "explorer_driven", "trainer_driven", "fully_async")


def required_version(
    style: str, interval: int, offset: int, step: int, held: int = 0, synced_at: int = 0
) -> int:
    """The version an explorer holding `held` (last synced after `synced_at` steps) needs before `step`."""
    if style == "fixed":
        return max(step - 1 - offset, 0) // interval * interval
    if style == "explorer_driven":
        return held + 1 if (step - 1) - synced_at >= interval else 0
    return 0


def trainer_publishes(style: str, interval: int, step: int, last_published_step: int) -> bool:
    """Whether the trainer publishes after `step` when no explorer waits for its weights."""
    if step <= last_published_step:
        return False
    if style == "fixed":
        return step % interval == 0
    if style == "explorer_driven":
        return False
    return step - last_published_step >= interval


@check("sync_plan")
async def sync_plan(ctx: SyncContext) -> str:
    """GetRunState's plan is valid (style one of fixed, explorer_driven, trainer_driven, fully_async;
    interval >= 1; offset >= 0). A new explorer (holding version 0) asking WaitForVersion(step = s,
    min_version 0) for s = 1 .. I+K+2 gets `required_version` as the plan says (fixed: (max(s-1-K, 0) //
    I) * I; explorer_driven: 1 once s-1 >= I; the others 0). A trainer's RequestSync(step t, a version
    above the published one), with no explorer waiting, is accepted exactly when the plan publishes after
    t (fixed: t % I == 0; trainer_driven, fully_async: t - L >= I, L the published version's step;
    explorer_driven: never), for t = L+1 .. L+2I+1 (nccl: only the refusals are judged, since an
    accepted broadcast also needs receivers); one for the published version itself is not accepted."""

    async def body() -> str:
        style, interval, offset = ctx.style, ctx.interval, ctx.offset
        require(style in STYLES, f"sync_style {style!r} is not one of {', '.join(STYLES)}")
        require(interval >= 1 and offset >= 0, f"sync_interval {interval}, sync_offset {offset}")
        explorer, _ = await ctx.register("plan", EXPLORER)
        for step in range(1, interval + offset + 3):
            want = required_version(style, interval, offset, step)
            reply = await ctx.wait(explorer, 1, step=step)
            if reply.required_version != want:
                raise CheckFailed(
                    f"{style} I={interval} K={offset}: before explorer step {step} required_version is "
                    f"{reply.required_version}, the plan says {want}"
                )
        await ctx.leave(explorer)
        published = (await ctx.state()).model_version
        last = published.step
        trainer, _ = await ctx.register("plan-trainer", TRAINER, step=last)
        judged = 0
        for step in range(last + 1, last + 2 * interval + 2):
            want = trainer_publishes(style, interval, step, last)
            decision = await ctx.request_sync(trainer, step, version=published.version + step, timeout_ms=200)
            if ctx.broadcast and want:
                continue
            judged += 1
            if decision.accepted != want:
                raise CheckFailed(
                    f"{style} I={interval}: RequestSync after trainer step {step} (last publish at step {last}) "
                    f"answered accepted={decision.accepted} ({decision.reason!r}), the plan says {want}"
                )
        same = await ctx.request_sync(
            trainer, last + 2 * interval + 2, version=published.version, timeout_ms=200
        )
        require(
            not same.accepted and same.reason,
            "RequestSync for the published version was accepted (or no reason)",
        )
        return f"{style} I={interval} K={offset}: explorer requirements and {judged} trainer decisions as planned"

    return await with_members(ctx, body)
