"""Registration, heartbeats and who may call what: the member rules of synchronizer.proto."""

from __future__ import annotations

import grpc
from rft.v1 import common_pb2, synchronizer_pb2

from launcher.conformance.harness import check, expect_error, require
from launcher.conformance.synchronizer_context import (
    CALL_TIMEOUT_S,
    EXPLORER,
    GONE,
    TRAINER,
    SyncContext,
    chunks_of,
    safetensors_blob,
    with_members,
)


@check("register")
async def register(ctx: SyncContext) -> str:
    """Register answers the published `model_version` (GetRunState's), `heartbeat_timeout_s` >= 1 and the
    run's `sync_method`; GetRunState then lists the member with its role, address and workers, alive, and
    `status_counts` agrees with the members' statuses. One trainer at a time: a second trainer id while the
    first is alive is FAILED_PRECONDITION; the same trainer id registering again (a restart) is accepted.
    A member id registered as an explorer registering as a trainer, a role left UNSPECIFIED and an empty
    member id are INVALID_ARGUMENT naming `member.role` / `member.member_id`."""

    async def body() -> str:
        state = await ctx.state()
        explorer, reply = await ctx.register("reg-explorer", EXPLORER, address="127.0.0.1:1", workers=2)
        require(
            reply.model_version.version == state.model_version.version,
            f"Register answered model_version {reply.model_version.version}, GetRunState has "
            f"{state.model_version.version}",
        )
        require(reply.heartbeat_timeout_s >= 1, f"heartbeat_timeout_s = {reply.heartbeat_timeout_s}")
        require(
            reply.sync_method == state.sync_method,
            f"sync_method {reply.sync_method!r} != {state.sync_method!r}",
        )
        listed = await ctx.member(explorer)
        require(
            (listed.role, listed.address, listed.workers) == (EXPLORER, "127.0.0.1:1", 2),
            f"GetRunState lists the explorer as role {listed.role}, address {listed.address!r}, workers "
            f"{listed.workers}",
        )
        require(listed.status not in GONE, f"a registered member has status {listed.status}")
        trainer, _ = await ctx.register("reg-trainer", TRAINER, address="127.0.0.1:2")
        second = synchronizer_pb2.Member(member_id=ctx.member_id("reg-trainer2"), role=TRAINER)
        await expect_error(
            ctx.stub.Register(synchronizer_pb2.RegisterRequest(member=second), timeout=CALL_TIMEOUT_S),
            grpc.StatusCode.FAILED_PRECONDITION,
            "a second trainer while the first is alive",
        )
        again = synchronizer_pb2.Member(member_id=trainer, role=TRAINER, address="127.0.0.1:2")
        await ctx.stub.Register(synchronizer_pb2.RegisterRequest(member=again), timeout=CALL_TIMEOUT_S)
        for member, field in (
            (synchronizer_pb2.Member(member_id=explorer, role=TRAINER), "member.role"),
            (synchronizer_pb2.Member(member_id=ctx.member_id("norole")), "member.role"),
            (synchronizer_pb2.Member(member_id="", role=EXPLORER), "member.member_id"),
        ):
            err = await expect_error(
                ctx.stub.Register(synchronizer_pb2.RegisterRequest(member=member), timeout=CALL_TIMEOUT_S),
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Register refused for {field}",
            )
            require(
                (err.details() or "").startswith(field),
                f"the refusal does not start with {field}: {err.details()!r}",
            )
        state = await ctx.state()
        counts: dict[str, int] = {}
        for m in state.members:
            name = common_pb2.MemberStatus.Name(m.status)
            counts[name] = counts.get(name, 0) + 1
        require(
            dict(state.status_counts) == counts,
            f"status_counts {dict(state.status_counts)} != members {counts}",
        )
        return "registered, listed, one trainer at a time, restarts accepted, bad roles and ids refused"

    return await with_members(ctx, body)


@check("unknown_member")
async def unknown_member(ctx: SyncContext) -> str:
    """A member id never registered is NOT_FOUND for Heartbeat, RequestSync, WaitForVersion, ReportSync and
    GetWeightSyncInfo; so is a member that left as LOST, until it registers again (then Heartbeat works)."""

    async def body() -> str:
        stranger = f"cf-{ctx.tag}-never-registered"
        calls = {
            "Heartbeat": lambda m: ctx.heartbeat(m),
            "RequestSync": lambda m: ctx.request_sync(m, 1),
            "WaitForVersion": lambda m: ctx.wait(m, 100),
            "ReportSync": lambda m: ctx.report(m, 1),
            "GetWeightSyncInfo": lambda m: ctx.stub.GetWeightSyncInfo(
                synchronizer_pb2.SyncGroupRequest(member_id=m), timeout=CALL_TIMEOUT_S
            ),
        }
        for name, call in calls.items():
            await expect_error(call(stranger), grpc.StatusCode.NOT_FOUND, f"{name} of an unknown member")
        member, _ = await ctx.register("lost", EXPLORER)
        await ctx.leave(member)
        require(
            (await ctx.member(member)).status == common_pb2.MEMBER_STATUS_LOST,
            "a member that left as LOST is not LOST",
        )
        for name, call in calls.items():
            await expect_error(call(member), grpc.StatusCode.NOT_FOUND, f"{name} of a member marked LOST")
        again = synchronizer_pb2.Member(member_id=member, role=EXPLORER)
        await ctx.stub.Register(synchronizer_pb2.RegisterRequest(member=again), timeout=CALL_TIMEOUT_S)
        await ctx.heartbeat(member)
        return f"{len(calls)} calls NOT_FOUND for an unknown and a LOST member; registering again restores it"

    return await with_members(ctx, body)


@check("heartbeat")
async def heartbeat(ctx: SyncContext) -> str:
    """Heartbeat answers the published `model_version` and the group `generation` GetRunState shows; a
    reported `step` shows in the member (and `explorer_step` / `trainer_step`), never going back; an
    explorer reporting STOPPED is listed STOPPED and its WaitForVersion is NOT_FOUND (it left the run)."""

    async def body() -> str:
        explorer, _ = await ctx.register("beat", EXPLORER)
        trainer, _ = await ctx.register("beat-trainer", TRAINER)
        reply = await ctx.heartbeat(explorer, status=common_pb2.MEMBER_STATUS_RUNNING, step=7)
        state = await ctx.state()
        require(
            reply.model_version.version == state.model_version.version,
            f"Heartbeat answered model_version {reply.model_version.version}, GetRunState "
            f"{state.model_version.version}",
        )
        require(reply.generation == state.generation, f"generation {reply.generation} != {state.generation}")
        await ctx.heartbeat(explorer, step=3)
        require(
            (await ctx.member(explorer)).step == 7, "a member's step went back after a lower heartbeat step"
        )
        require(state.explorer_step >= 7, f"explorer_step {state.explorer_step} after an explorer reported 7")
        await ctx.heartbeat(trainer, step=5)
        require((await ctx.state()).trainer_step >= 5, "trainer_step did not follow the trainer's heartbeat")
        await ctx.heartbeat(explorer, status=common_pb2.MEMBER_STATUS_STOPPED)
        require(
            (await ctx.member(explorer)).status == common_pb2.MEMBER_STATUS_STOPPED, "STOPPED was not kept"
        )
        await expect_error(
            ctx.wait(explorer, 100), grpc.StatusCode.NOT_FOUND, "WaitForVersion of a STOPPED explorer"
        )
        return "heartbeats answer the published version and generation; steps monotonic; STOPPED leaves"

    return await with_members(ctx, body)


@check("roles_and_methods")
async def roles_and_methods(ctx: SyncContext) -> str:
    """Calls of another role or another sync_method are FAILED_PRECONDITION: RequestSync of an explorer;
    GetWeightSyncInfo when the method is not a broadcast one (nccl); PushWeights when it is not a pushed
    one (memory, memory_bf16)."""

    async def body() -> str:
        explorer, _ = await ctx.register("role", EXPLORER)
        await expect_error(
            ctx.request_sync(explorer, 1), grpc.StatusCode.FAILED_PRECONDITION, "RequestSync of an explorer"
        )
        done = ["RequestSync of an explorer"]
        if not ctx.broadcast:
            request = synchronizer_pb2.SyncGroupRequest(member_id=explorer)
            await expect_error(
                ctx.stub.GetWeightSyncInfo(request, timeout=CALL_TIMEOUT_S),
                grpc.StatusCode.FAILED_PRECONDITION,
                f"GetWeightSyncInfo under sync_method {ctx.method}",
            )
            done.append("GetWeightSyncInfo")
        if not ctx.pushed:
            version = (await ctx.state()).model_version.version + 1
            await expect_error(
                ctx.push(chunks_of(version, 1, safetensors_blob(version), 1)),
                grpc.StatusCode.FAILED_PRECONDITION,
                f"PushWeights under sync_method {ctx.method}",
            )
            require(
                (await ctx.state()).model_version.version == version - 1,
                "a refused push changed model_version",
            )
            done.append("PushWeights")
        return f"FAILED_PRECONDITION for {', '.join(done)} (sync_method {ctx.method})"

    return await with_members(ctx, body)
