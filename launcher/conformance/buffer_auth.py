"""Auth before parse: with auth on, a call without the right token is UNAUTHENTICATED whatever its body."""

from __future__ import annotations

from rft.v1 import buffer_pb2

from launcher.conformance.buffer_context import BufferContext
from launcher.conformance.harness import auth_before_parse_of, check

METHODS = ("Put", "PutSequenced", "GetBatch", "Ack", "Nack", "OpenConsumer", "Stats")


@check("auth_before_parse")
async def auth_before_parse(ctx: BufferContext) -> str:
    """Needs --auth-token and a server with auth on (else SKIP, saying which). Without a token, and with a
    wrong one, every BufferService call, unary and the PutExperiences stream, is UNAUTHENTICATED even
    when its body is not a protobuf message (the token is checked before the body is parsed); with the
    token, the same garbage is INVALID_ARGUMENT (parsed, then refused)."""
    probe = ("Stats", buffer_pb2.StatsRequest(consumer_group=ctx.group).SerializeToString())
    return await auth_before_parse_of(
        ctx.address, ctx.channel, ctx.auth_token, ctx.tag, "rft.v1.BufferService", probe,
        unary=METHODS, client_streams=("PutExperiences",), parsed="Ack",
    )  # fmt: skip
