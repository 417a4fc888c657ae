"""Weight calls, serve-mode calls, bounds and auth of ExplorerService: refusals that change nothing."""

from __future__ import annotations

import grpc
from rft.v1 import common_pb2, explorer_pb2

from launcher.conformance.explorer_context import CALL_TIMEOUT_S, ExplorerContext
from launcher.conformance.harness import auth_before_parse_of, check, expect_error, refused, require

SERVICE = "rft.v1.ExplorerService"
UNARY = ("Explore", "Eval", "SetupWeightSyncGroup", "TeardownWeightSyncGroup", "ReceiveWeights", "Bench",
         "Status", "Shutdown", "Feedback", "Commit")  # fmt: skip


def _chunk(index: int, total: int, data: bytes, total_bytes: int, version: int) -> common_pb2.WeightChunk:
    return common_pb2.WeightChunk(
        version=common_pb2.ModelVersion(version=version),
        index=index,
        total=total,
        data=data,
        total_bytes=total_bytes,
    )


@check("weights_refused")
async def weights_refused(ctx: ExplorerContext) -> str:
    """ReceiveWeights with `version` 0 is INVALID_ARGUMENT naming `version`. LoadWeights of an empty stream,
    of a stream missing a chunk, and of a stream whose bytes are not a safetensors state dict is
    INVALID_ARGUMENT; none changes Status's `model_version`."""
    before = (await ctx.status()).model_version.version
    err = await expect_error(
        ctx.stub.ReceiveWeights(
            explorer_pb2.ExplorerReceiveWeightsRequest(version=0), timeout=CALL_TIMEOUT_S
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ReceiveWeights of version 0",
    )
    require(
        (err.details() or "").startswith("version"),
        f"the refusal does not start with version: {err.details()!r}",
    )
    version = before + 1000
    streams = {
        "an empty stream": [],
        "a stream missing a chunk": [
            _chunk(0, 3, b"a" * 8, 24, version),
            _chunk(2, 3, b"c" * 8, 24, version),
        ],
        "bytes that are no safetensors state dict": [_chunk(0, 1, b"\x08" + b"\xff" * 15, 16, version)],
    }
    for what, chunks in streams.items():
        await expect_error(
            ctx.stub.LoadWeights(iter(chunks), timeout=CALL_TIMEOUT_S),
            grpc.StatusCode.INVALID_ARGUMENT,
            f"LoadWeights of {what}",
        )
    after = (await ctx.status()).model_version.version
    require(after == before, f"a refused LoadWeights changed model_version {before} -> {after}")
    return f"version 0 and {len(streams)} broken weight streams refused; model_version stays {before}"


@check("weight_group_calls")
async def weight_group_calls(ctx: ExplorerContext) -> str:
    """--drive only. With no weight-sync group joined, TeardownWeightSyncGroup(generation 0) answers OK (there
    is nothing to leave) and ReceiveWeights(version 1) is FAILED_PRECONDITION (join first)."""
    ctx.driving()
    await ctx.stub.TeardownWeightSyncGroup(
        explorer_pb2.ExplorerTeardownWeightSyncGroupRequest(generation=0), timeout=CALL_TIMEOUT_S
    )
    await expect_error(
        ctx.stub.ReceiveWeights(
            explorer_pb2.ExplorerReceiveWeightsRequest(version=1), timeout=CALL_TIMEOUT_S
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "ReceiveWeights with no group joined",
    )
    return "teardown of no group answers OK; ReceiveWeights without a group is FAILED_PRECONDITION"


@check("serve_calls")
async def serve_calls(ctx: ExplorerContext) -> str:
    """Feedback and Commit belong to serve mode. On an explorer that serves no endpoint both are
    FAILED_PRECONDITION. On one that does: Feedback of an unknown session is NOT_FOUND, Feedback with
    neither or both of `session_id` and `response_id` is INVALID_ARGUMENT, Commit of an unknown session is
    NOT_FOUND and Commit of no session INVALID_ARGUMENT (nothing changes either way)."""
    unknown = f"cf-{ctx.tag}-no-such-session"
    feedback = ctx.stub.Feedback(
        explorer_pb2.ServeFeedbackRequest(session_id=unknown, reward=1.0), timeout=CALL_TIMEOUT_S
    )
    try:
        await feedback
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
    else:
        code = grpc.StatusCode.OK
    commit = explorer_pb2.ServeCommitRequest
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        await expect_error(
            ctx.stub.Commit(commit(session_ids=[unknown]), timeout=CALL_TIMEOUT_S),
            grpc.StatusCode.FAILED_PRECONDITION,
            "Commit on an explorer whose Feedback says it serves no endpoint",
        )
        return "serves no endpoint: Feedback and Commit are FAILED_PRECONDITION"
    require(code == grpc.StatusCode.NOT_FOUND, f"Feedback of an unknown session: {code.name}, want NOT_FOUND "
            "(serving) or FAILED_PRECONDITION (not serving)")  # fmt: skip
    for what, request in {
        "neither id": explorer_pb2.ServeFeedbackRequest(reward=1.0),
        "both ids": explorer_pb2.ServeFeedbackRequest(session_id=unknown, response_id=unknown, reward=1.0),
    }.items():
        await expect_error(
            ctx.stub.Feedback(request, timeout=CALL_TIMEOUT_S),
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Feedback with {what}",
        )
    await expect_error(ctx.stub.Commit(commit(session_ids=[unknown]), timeout=CALL_TIMEOUT_S), grpc.StatusCode.NOT_FOUND,
                       "Commit of an unknown session")  # fmt: skip
    await expect_error(
        ctx.stub.Commit(commit(), timeout=CALL_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "Commit of no session",
    )
    return "serves an endpoint: unknown sessions NOT_FOUND, malformed feedback and commits INVALID_ARGUMENT"


@check("bounds")
async def bounds(ctx: ExplorerContext) -> str:
    """Strings and lists over their bound are INVALID_ARGUMENT starting with the field's path, at most 512
    characters, showing at most 64 of the value: an Eval `tasksets[1]` of 129 characters and 65,537
    `tasksets`; a Feedback `session_id` / `response_id` of 1025 characters; a Commit `session_ids[0]` of
    1025 characters; a SetupWeightSyncGroup `group.master_address` of 257, `group.group_name` of 129 and
    `group.tensors[0].name` of 1025 characters. A 1024-character `session_id` is within the bound (not
    INVALID_ARGUMENT)."""
    t = CALL_TIMEOUT_S
    long_name = "t" * 129
    await refused(
        ctx.stub.Eval(explorer_pb2.EvalRequest(tasksets=["a", long_name]), timeout=t),
        "tasksets[1]",
        long_name,
    )
    await refused(ctx.stub.Eval(explorer_pb2.EvalRequest(tasksets=["a"] * 65_537), timeout=t), "tasksets")
    sid = "s" * 1025
    feedback = explorer_pb2.ServeFeedbackRequest
    await refused(ctx.stub.Feedback(feedback(session_id=sid), timeout=t), "session_id", sid)
    await refused(ctx.stub.Feedback(feedback(response_id=sid), timeout=t), "response_id", sid)
    await refused(
        ctx.stub.Commit(explorer_pb2.ServeCommitRequest(session_ids=[sid]), timeout=t), "session_ids[0]", sid
    )
    info, setup = common_pb2.WeightSyncGroupInfo, explorer_pb2.ExplorerSetupWeightSyncGroupRequest
    for group, field, value in (
        (info(master_address="h" * 257), "group.master_address", "h" * 257),
        (info(group_name="g" * 129), "group.group_name", "g" * 129),
        (info(tensors=[common_pb2.TensorMeta(name="n" * 1025)]), "group.tensors[0].name", "n" * 1025),
    ):
        await refused(ctx.stub.SetupWeightSyncGroup(setup(group=group), timeout=t), field, value)
    edge = f"cf-{ctx.tag}-".ljust(1024, "s")
    try:
        await ctx.stub.Feedback(feedback(session_id=edge, reward=1.0), timeout=t)
    except grpc.aio.AioRpcError as exc:
        require(
            exc.code() != grpc.StatusCode.INVALID_ARGUMENT, f"a 1024-character session_id: {exc.details()!r}"
        )
    return "tasksets, session_id, response_id, session_ids, group.* refused by name, briefly"


@check("auth_before_parse")
async def auth_before_parse(ctx: ExplorerContext) -> str:
    """Needs --auth-token and a server with auth on (else SKIP, saying which). Without a token, and with a
    wrong one, every ExplorerService call (unary and the LoadWeights stream) is UNAUTHENTICATED even when
    its body is not a protobuf message; with the token, the same garbage sent to Eval is INVALID_ARGUMENT."""
    probe = ("Status", explorer_pb2.ExplorerStatusRequest().SerializeToString())
    return await auth_before_parse_of(
        ctx.address, ctx.channel, ctx.auth_token, ctx.tag, SERVICE, probe, unary=UNARY,
        client_streams=("LoadWeights",), parsed="Eval",
    )  # fmt: skip
