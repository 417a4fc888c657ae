"""Auth before parse: with auth on, a call without the right token is UNAUTHENTICATED whatever its body."""

from __future__ import annotations

import grpc
from rft.v1 import buffer_pb2

from launcher.conformance.buffer_context import CALL_TIMEOUT_S, BufferContext
from launcher.conformance.harness import CheckSkipped, check, expect_error, one_line
from services.common.rpc import create_channel

GARBAGE = b"\xff\xff\xff\xff\x0f"  # not a protobuf message: a truncated varint of an invalid tag
METHODS = ("Put", "PutSequenced", "GetBatch", "Ack", "Nack", "OpenConsumer", "Stats")


@check("auth_before_parse")
async def auth_before_parse(ctx: BufferContext) -> str:
    """Needs --auth-token and a server with auth on (else SKIP, saying which). Without a token, and with a
    wrong one, every BufferService call, unary and the PutExperiences stream, is UNAUTHENTICATED even
    when its body is not a protobuf message (the token is checked before the body is parsed); with the
    token, the same garbage is INVALID_ARGUMENT (parsed, then refused)."""
    if not ctx.auth_token:
        raise CheckSkipped("no --auth-token given: cannot tell a server with auth on")
    async with create_channel(ctx.address, timeout_s=CALL_TIMEOUT_S, retries=2) as bare:
        try:
            await bare.unary_unary("/rft.v1.BufferService/Stats")(
                buffer_pb2.StatsRequest(consumer_group=ctx.group).SerializeToString(), timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise
        else:
            raise CheckSkipped("the server answers Stats without a token: auth is off there")
        for token in ("", "wrong-" + ctx.tag):
            metadata = (("authorization", f"Bearer {token}"),) if token else None
            who = "with a wrong token" if token else "without a token"
            for method in METHODS:
                call = bare.unary_unary(f"/rft.v1.BufferService/{method}")
                await expect_error(
                    call(GARBAGE, timeout=CALL_TIMEOUT_S, metadata=metadata),
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"{method} {who} and a malformed body",
                )
            stream = bare.stream_unary("/rft.v1.BufferService/PutExperiences")
            await expect_error(
                stream(iter([GARBAGE]), timeout=CALL_TIMEOUT_S, metadata=metadata),
                grpc.StatusCode.UNAUTHENTICATED,
                f"PutExperiences {who} and a malformed body",
            )
    call = ctx.channel.unary_unary("/rft.v1.BufferService/Ack")
    err = await expect_error(
        call(GARBAGE, timeout=CALL_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "Ack with the token and garbage",
    )
    return f"{len(METHODS) + 1} methods refused garbage without/with a wrong token; with it: {one_line(err.details(), 60)}"
