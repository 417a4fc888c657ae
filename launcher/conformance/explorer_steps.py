"""Status, explore and eval steps: what an explorer reports about itself and how its steps advance."""

from __future__ import annotations

import math

import grpc
from rft.v1 import common_pb2, explorer_pb2

from launcher.conformance.explorer_context import STEP_TIMEOUT_S, ExplorerContext
from launcher.conformance.harness import check, expect_error, require

STATUSES = set(common_pb2.MemberStatus.values()) - {common_pb2.MEMBER_STATUS_UNSPECIFIED}


@check("status")
async def status(ctx: ExplorerContext) -> str:
    """Status answers a non-empty `explorer_id` of at most 128 characters, a `status` other than
    UNSPECIFIED, `rollout_workers` >= 1, `step` >= 0 and `model_version.version` >= 0; a second Status
    answers the same id, and neither its step nor its version is lower."""
    first = await ctx.status()
    require(0 < len(first.explorer_id) <= 128, f"explorer_id has {len(first.explorer_id)} characters")
    require(first.status in STATUSES, f"status {first.status} is not a MemberStatus other than UNSPECIFIED")
    require(first.rollout_workers >= 1, f"rollout_workers = {first.rollout_workers}")
    require(
        first.step >= 0 and first.model_version.version >= 0,
        f"step {first.step}, version {first.model_version.version}",
    )
    second = await ctx.status()
    require(
        second.explorer_id == first.explorer_id,
        f"explorer_id changed: {first.explorer_id!r} -> {second.explorer_id!r}",
    )
    require(second.step >= first.step, f"step went back: {first.step} -> {second.step}")
    require(
        second.model_version.version >= first.model_version.version,
        "model_version went back between two Status calls",
    )
    name = common_pb2.MemberStatus.Name(first.status)
    return f"{first.explorer_id}: {name}, step {first.step}, version {first.model_version.version}, {first.rollout_workers} workers"


@check("explore_steps")
async def explore_steps(ctx: ExplorerContext) -> str:
    """--drive only. Explore(steps = 1) runs one step: the answer's `step` is Status's step before + 1 (or
    unchanged with `continue_exploring` false when the tasksets are used up), `experiences` >= 0, finite
    metrics; Status then reports that step. Explore(steps = 2) advances two more."""
    ctx.driving()
    before = (await ctx.status()).step
    expected, ran = before, 0
    for steps in (1, 2):
        reply = await ctx.stub.Explore(explorer_pb2.ExploreRequest(steps=steps), timeout=STEP_TIMEOUT_S)
        # used up tasksets end a call early: then fewer steps than asked ran
        low = expected + steps if reply.continue_exploring else expected
        require(
            low <= reply.step <= expected + steps,
            f"Explore(steps={steps}) from step {expected} answered step {reply.step} "
            f"(continue_exploring={reply.continue_exploring})",
        )
        expected = reply.step
        require(reply.experiences >= 0, f"experiences = {reply.experiences}")
        bad = [k for k, v in reply.metrics.items() if not math.isfinite(v)]
        require(not bad, f"non-finite metrics {bad[:3]}")
        now = (await ctx.status()).step
        require(now == reply.step, f"Status reports step {now} after Explore answered {reply.step}")
        ran += reply.experiences
        if not reply.continue_exploring:
            break
    return f"steps {before} -> {expected}, {ran} experiences"


@check("eval")
async def eval_tasksets(ctx: ExplorerContext) -> str:
    """--drive only. Eval of a taskset name the explorer does not have is INVALID_ARGUMENT naming it; Eval
    of every eval taskset (an empty list) answers the current step and finite metrics, and changes no step."""
    ctx.driving()
    unknown = f"cf-{ctx.tag}-no-such-taskset"
    request = explorer_pb2.EvalRequest(tasksets=[unknown])
    err = await expect_error(
        ctx.stub.Eval(request, timeout=STEP_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "Eval of an unknown taskset",
    )
    require(unknown in (err.details() or ""), f"the refusal does not name the taskset: {err.details()!r}")
    before = (await ctx.status()).step
    reply = await ctx.stub.Eval(explorer_pb2.EvalRequest(), timeout=STEP_TIMEOUT_S)
    require(reply.step == before, f"Eval answered step {reply.step}, Status had {before}")
    bad = [k for k, v in reply.metrics.items() if not math.isfinite(v)]
    require(not bad, f"non-finite eval metrics {bad[:3]}")
    require((await ctx.status()).step == before, "Eval changed the explorer's step")
    return f"unknown taskset refused; {len(reply.metrics)} eval metrics at step {before}"
