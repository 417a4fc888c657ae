"""`rft conformance buffer` against real servers: the project's buffer (a `python -m services.buffer`
process, memory store and Redis store on a real redis-server, auth on) passes every check; a buffer broken
on purpose (a real grpc.aio BufferService in this test that forwards to the real one but breaks one
guarantee) fails the check named for it, with exit code 1. The suite runs as the `rft` command in a
subprocess, as a user runs it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from rft.v1 import buffer_pb2, buffer_pb2_grpc

from launcher.conformance.buffer import CHECKS
from services.common.rpc import create_channel
from tests.support.conformance import conformance as run_conformance
from tests.support.conformance import service_process, statuses

ROOT = Path(__file__).resolve().parents[3]
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'protos'}")
TOKEN = "conformance-token"
NAMES = [c.name for c in CHECKS]


@contextmanager
def buffer_process(tmp_path: Path, store: str, redis_url: str = "", token: str = "") -> Iterator[str]:
    """A buffer service process on a free port declaring `default` and `conformance`; yields its address."""
    lines = ["services:"] + ([f"  auth_token: {token}"] if token else [])
    lines += [
        "  buffer:",
        f"    store: {store}",
        "    port: 0",
        "    consumer_groups: [default, conformance]",
    ]
    lines += (
        [f"    redis_url: {redis_url}", f"    stream_prefix: cf-{tmp_path.name[-8:]}"] if redis_url else []
    )
    lines += ["log:", "  level: WARNING", ""]
    with service_process("buffer", "\n".join(lines), tmp_path) as address:
        yield address


async def conformance(address: str, *args: str) -> tuple[int, str]:
    """Run `rft conformance buffer ADDRESS ARGS` as a process; (exit code, stdout + stderr)."""
    return await run_conformance("buffer", address, *args)


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_the_project_buffer_passes_every_check(store, tmp_path, request):
    redis_url = request.getfixturevalue("redis_server").url if store == "redis" else ""
    with buffer_process(tmp_path, store, redis_url, token=TOKEN) as address:
        code, output = await conformance(address, "--auth-token", TOKEN)
        assert statuses(output) == dict.fromkeys(NAMES, "PASS"), output
        assert code == 0, output
        # a second run on the same server isolates itself from the first (new tag, drained group)
        code, output = await conformance(address, "--auth-token", TOKEN)
        assert code == 0 and statuses(output) == dict.fromkeys(NAMES, "PASS"), output
        # usage errors: an undeclared group, a missing token
        code, output = await conformance(address, "--auth-token", TOKEN, "--group", "not-declared")
        assert code == 2 and "'not-declared'" in output and "consumer_groups" in output, output
        code, output = await conformance(address)
        assert code == 2 and "--auth-token" in output, output


class BrokenBuffer(buffer_pb2_grpc.BufferServiceServicer):
    """A BufferService that forwards every call to a real buffer but breaks one guarantee on purpose:
    `ack_not_idempotent` refuses a repeated Ack; `split_groups` cuts a lease to its first `size`
    experiences, splitting a group larger than `size`."""

    def __init__(self, target: buffer_pb2_grpc.BufferServiceStub, breaks: str):
        self.target, self.breaks = target, breaks
        self.acked: set[str] = set()

    async def _forward(self, method: str, request, context: grpc.aio.ServicerContext):
        try:
            return await getattr(self.target, method)(request)
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")

    async def PutExperiences(self, request_iterator, context):
        return await self._forward("PutExperiences", request_iterator, context)

    async def Put(self, request, context):
        return await self._forward("Put", request, context)

    async def PutSequenced(self, request, context):
        return await self._forward("PutSequenced", request, context)

    async def GetBatch(self, request, context):
        reply = await self._forward("GetBatch", request, context)
        if self.breaks == "split_groups" and len(reply.experiences) > request.size:
            del reply.experiences[request.size :]
        return reply

    async def Ack(self, request, context):
        if self.breaks == "ack_not_idempotent" and request.lease_id in self.acked:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "lease is unknown or already acked")
        reply = await self._forward("Ack", request, context)
        self.acked.add(request.lease_id)
        return reply

    async def Nack(self, request, context):
        return await self._forward("Nack", request, context)

    async def OpenConsumer(self, request, context):
        return await self._forward("OpenConsumer", request, context)

    async def Stats(self, request, context):
        return await self._forward("Stats", request, context)


@pytest.mark.parametrize(
    ("breaks", "check"), [("ack_not_idempotent", "ack_idempotent"), ("split_groups", "lease_whole_groups")]
)
async def test_a_broken_buffer_fails_the_named_check(breaks, check, tmp_path):
    with buffer_process(tmp_path, "memory") as real:
        async with create_channel(real, timeout_s=10) as channel:
            server = grpc.aio.server()
            buffer_pb2_grpc.add_BufferServiceServicer_to_server(
                BrokenBuffer(buffer_pb2_grpc.BufferServiceStub(channel), breaks), server
            )
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                code, output = await conformance(f"127.0.0.1:{port}")
            finally:
                await server.stop(None)
    found = statuses(output)
    assert found[check] == "FAIL", output
    assert code == 1, output
    assert found["auth_before_parse"] == "SKIP" and "no --auth-token" in output, output
    assert found["put_exactly_once"] == found["fencing"] == "PASS", output


async def test_the_broken_buffer_proxy_is_faithful_when_it_breaks_nothing(tmp_path):
    """The proxy above, breaking nothing, passes: the failures it shows are the ones it was told to make."""
    with buffer_process(tmp_path, "memory") as real:
        async with create_channel(real, timeout_s=10) as channel:
            server = grpc.aio.server()
            stub = buffer_pb2_grpc.BufferServiceStub(channel)
            buffer_pb2_grpc.add_BufferServiceServicer_to_server(BrokenBuffer(stub, "nothing"), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                stats = await stub.Stats(buffer_pb2.StatsRequest(consumer_group="conformance"))
                assert stats.store == "memory"
                code, output = await conformance(f"127.0.0.1:{port}")
            finally:
                await server.stop(None)
    assert code == 0, output
    assert statuses(output) == {**dict.fromkeys(NAMES, "PASS"), "auth_before_parse": "SKIP"}, output
