"""The server kit's request checks on real grpc.aio servers (port 0): undecodable request bytes are
INVALID_ARGUMENT naming the request type (unary, client-streaming, server-streaming), the bearer token
is checked before the body is read (an unauthenticated call is never parsed), and a port in use is a
startup error instead of a second server sharing it (SO_REUSEPORT off)."""

from __future__ import annotations

import grpc
import pytest
from rft.v1 import buffer_pb2, buffer_pb2_grpc, experience_pb2

from services.common.rpc import PortInUseError, create_channel, start_server

SERVICE = "rft.v1.BufferService"
GARBAGE = b"\xff\xff\xff"  # a truncated varint: no protobuf message decodes from it


class Recorder(buffer_pb2_grpc.BufferServiceServicer):
    """Answers Stats and PutExperiences, and counts what its request deserializers were given."""

    def __init__(self) -> None:
        self.parsed = 0
        self.batches = 0

    def parse_stats(self, data: bytes) -> buffer_pb2.StatsRequest:
        self.parsed += 1
        return buffer_pb2.StatsRequest.FromString(data)

    def parse_batch(self, data: bytes) -> experience_pb2.ExperienceBatch:
        self.parsed += 1
        return experience_pb2.ExperienceBatch.FromString(data)

    async def Stats(self, request, context):
        return buffer_pb2.StatsResponse(size=7, store="test")

    async def PutExperiences(self, request_iterator, context):
        async for _ in request_iterator:
            self.batches += 1
        return buffer_pb2.PutResponse(batches=self.batches)


def _add_recorder(servicer: Recorder, server: grpc.aio.Server) -> None:
    put = buffer_pb2.PutResponse.SerializeToString
    handlers = {
        "Stats": grpc.unary_unary_rpc_method_handler(
            servicer.Stats,
            request_deserializer=servicer.parse_stats,
            response_serializer=buffer_pb2.StatsResponse.SerializeToString,
        ),
        "PutExperiences": grpc.stream_unary_rpc_method_handler(
            servicer.PutExperiences, request_deserializer=servicer.parse_batch, response_serializer=put
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


async def _start(servicer: Recorder, **kw):
    return await start_server([(_add_recorder, servicer, SERVICE)], **kw)


def _raw_unary(channel: grpc.aio.Channel, method: str):
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


def _raw_stream(channel: grpc.aio.Channel, method: str):
    return channel.stream_unary(method, request_serializer=None, response_deserializer=None)


async def test_undecodable_unary_request_is_invalid_argument_naming_its_type():
    servicer = Recorder()
    handle = await _start(servicer)
    try:
        async with create_channel(handle.address) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _raw_unary(ch, f"/{SERVICE}/Stats")(GARBAGE, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details().startswith("request: cannot decode rft.v1.StatsRequest")
            # the same server still answers good requests
            assert (await buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest())).size == 7
    finally:
        await handle.stop(0)


async def test_undecodable_message_in_a_request_stream_is_invalid_argument():
    servicer = Recorder()
    handle = await _start(servicer)
    good = experience_pb2.ExperienceBatch(vocab_size=5).SerializeToString()
    try:
        async with create_channel(handle.address) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _raw_stream(ch, f"/{SERVICE}/PutExperiences")(iter([good, GARBAGE, good]), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = err.value.details()
            assert details.startswith("request: cannot decode rft.v1.ExperienceBatch (stream message 1)")
            assert servicer.batches == 1  # the good first message was handled, nothing after the bad one
    finally:
        await handle.stop(0)


async def test_undecodable_request_of_a_server_stream_is_invalid_argument():
    handle = await _start(Recorder())
    try:
        async with create_channel(handle.address) as ch:
            watch = ch.unary_stream(
                "/grpc.health.v1.Health/Watch", request_serializer=None, response_deserializer=None
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in watch(GARBAGE, timeout=5):
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "cannot decode grpc.health.v1.HealthCheckRequest" in err.value.details()
    finally:
        await handle.stop(0)


async def test_token_is_checked_before_the_body_is_parsed():
    servicer = Recorder()
    handle = await _start(servicer, auth_token="s3cret")
    try:
        async with create_channel(handle.address) as ch:  # no token
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _raw_unary(ch, f"/{SERVICE}/Stats")(GARBAGE, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _raw_stream(ch, f"/{SERVICE}/PutExperiences")(iter([GARBAGE, GARBAGE]), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as err:  # a well-formed body is not parsed either
                await buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert servicer.parsed == 0
        async with create_channel(handle.address, auth_token="s3cret") as ch:  # the token, then the body
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _raw_unary(ch, f"/{SERVICE}/Stats")(GARBAGE, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert servicer.parsed == 1
    finally:
        await handle.stop(0)


async def test_a_port_in_use_is_a_startup_error():
    first = await _start(Recorder())
    try:
        with pytest.raises(PortInUseError, match=f"port {first.port} on 127.0.0.1 is in use"):
            await _start(Recorder(), port=first.port)
        async with create_channel(first.address) as ch:  # the first server keeps its port and its clients
            assert (await buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest())).size == 7
    finally:
        await first.stop(0)
