"""Bounds and auth of SynchronizerService requests: INVALID_ARGUMENT naming the field, briefly, and
changing nothing; UNAUTHENTICATED before the body is parsed when a token is set."""

from __future__ import annotations

from rft.v1 import common_pb2, synchronizer_pb2

from launcher.conformance.harness import auth_before_parse_of, check, refused, require
from launcher.conformance.synchronizer_context import CALL_TIMEOUT_S, EXPLORER, SyncContext, with_members

SERVICE = "rft.v1.SynchronizerService"
UNARY = ("Register", "Heartbeat", "GetRunState", "RequestSync", "WaitForVersion", "GetWeightSyncInfo",
         "NotifyCheckpoint", "ReportSync", "Shutdown")  # fmt: skip


async def _pull(ctx: SyncContext, request: synchronizer_pb2.PullWeightsRequest) -> None:
    async for _ in ctx.stub.PullWeights(request, timeout=CALL_TIMEOUT_S):
        pass


@check("bounds")
async def bounds(ctx: SyncContext) -> str:
    """Strings and lists over their bound are INVALID_ARGUMENT whose message starts with the field's path,
    is at most 512 characters and shows at most 64 of the value: a 10,000-character `member.member_id`
    (Register) and `member_id` (Heartbeat, RequestSync, WaitForVersion, PullWeights), a 257-character
    `member.address`, a 4097-character ReportSync `message` and `checkpoint_path`, a 1025-character
    `tensors[0].name`, a 17-dimension `tensors[1].shape`. None registers anything; a 128-character
    member id (the bound) registers."""

    async def body() -> str:
        huge = f"cf-{ctx.tag}-".ljust(10_000, "m")
        stub, t = ctx.stub, CALL_TIMEOUT_S
        member = synchronizer_pb2.Member

        def register(**fields):
            return stub.Register(
                synchronizer_pb2.RegisterRequest(member=member(role=EXPLORER, **fields)), timeout=t
            )

        await refused(register(member_id=huge), "member.member_id", huge)
        addr = ctx.member_id("addr")
        await refused(register(member_id=addr, address="a" * 257), "member.address", "a" * 257)
        await refused(ctx.heartbeat(huge), "member_id", huge)
        await refused(ctx.request_sync(huge, 1), "member_id", huge)
        await refused(ctx.wait(huge, 100), "member_id", huge)
        await refused(_pull(ctx, synchronizer_pb2.PullWeightsRequest(member_id=huge)), "member_id", huge)
        await refused(ctx.report(ctx.member_id("msg"), 1, message="x" * 4097), "message", "x" * 4097)
        path = "/" * 4097
        notice = common_pb2.ModelVersion(version=1 << 40, checkpoint_path=path)
        await refused(stub.NotifyCheckpoint(notice, timeout=t), "checkpoint_path", path)
        tensor, group_of = common_pb2.TensorMeta, synchronizer_pb2.SyncGroupRequest
        name = "n" * 1025
        await refused(stub.GetWeightSyncInfo(group_of(member_id="t", tensors=[tensor(name=name)]), timeout=t),
                      "tensors[0].name", name)  # fmt: skip
        shapes = [tensor(name="w"), tensor(name="v", shape=[1] * 17)]
        await refused(
            stub.GetWeightSyncInfo(group_of(member_id="t", tensors=shapes), timeout=t), "tensors[1].shape"
        )
        listed = {m.member_id for m in (await ctx.state()).members}
        require(huge not in listed and addr not in listed, "a refused Register registered its member")
        edge = f"cf-{ctx.tag}-".ljust(128, "e")
        await register(member_id=edge)
        ctx.joined.append(edge)
        require(
            edge in [m.member_id for m in (await ctx.state()).members],
            "a 128-character member id did not register",
        )
        return "member_id, address, message, checkpoint_path, tensors[i].name/shape refused by name, briefly"

    return await with_members(ctx, body)


@check("auth_before_parse")
async def auth_before_parse(ctx: SyncContext) -> str:
    """Needs --auth-token and a server with auth on (else SKIP, saying which). Without a token, and with a
    wrong one, every SynchronizerService call (unary, the PushWeights and PullWeights streams) is
    UNAUTHENTICATED even when its body is not a protobuf message; with the token, the same garbage sent to
    Heartbeat is INVALID_ARGUMENT (parsed, then refused)."""
    probe = ("GetRunState", synchronizer_pb2.GetRunStateRequest().SerializeToString())
    return await auth_before_parse_of(
        ctx.address, ctx.channel, ctx.auth_token, ctx.tag, SERVICE, probe, unary=UNARY,
        client_streams=("PushWeights",), server_streams=("PullWeights",), parsed="Heartbeat",
    )  # fmt: skip
