"""Trace context across real grpc.aio servers on port 0 (services/common/rpc/trace_context.py): a caller's
span is the parent of the client span, whose `traceparent` metadata makes the server's span its child; a
handler's own calls carry it on to the next server; a client stream carries it too; a refused call
(wrong token) still has its server span."""

from __future__ import annotations

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from rft.v1 import buffer_pb2, buffer_pb2_grpc, experience_pb2, liveness_pb2, liveness_pb2_grpc

from services.common import liveness, tracing
from services.common.rpc import create_channel, start_server

BUFFER = "rft.v1.BufferService"


class Forwarding(buffer_pb2_grpc.BufferServiceServicer):
    """Stats asks a second server (its Liveness) before answering; PutExperiences drains its stream."""

    def __init__(self, downstream: str) -> None:
        self.downstream = downstream

    async def Stats(self, request, context):
        async with create_channel(self.downstream) as channel:
            await liveness_pb2_grpc.LivenessStub(channel).Progress(liveness_pb2.ProgressRequest())
        return buffer_pb2.StatsResponse(size=1, store="test")

    async def PutExperiences(self, request_iterator, context):
        async for _ in request_iterator:
            pass
        return buffer_pb2.PutResponse()


@pytest.fixture
def exporter():
    exporter = InMemorySpanExporter()
    tracing.setup_tracing("buffer", None, exporter=exporter)
    yield exporter
    tracing.shutdown_tracing()


async def test_parent_child_across_the_boundary(exporter):
    second = await start_server([liveness.registration()])
    first = await start_server(
        [(buffer_pb2_grpc.add_BufferServiceServicer_to_server, Forwarding(second.address), BUFFER)]
    )
    try:
        async with create_channel(first.address) as channel:
            stub = buffer_pb2_grpc.BufferServiceStub(channel)
            with tracing.span("caller") as caller:
                await stub.Stats(buffer_pb2.StatsRequest())

                async def batches():
                    yield experience_pb2.ExperienceBatch()

                await stub.PutExperiences(batches())
    finally:
        await first.stop(0)
        await second.stop(0)
    spans = exporter.get_finished_spans()
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    trace_id = caller.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}  # one trace, through both servers

    def only(name, kind):
        (span,) = [s for s in by_name[name] if s.kind is kind]
        return span

    client = only(f"{BUFFER}/Stats", SpanKind.CLIENT)
    server = only(f"{BUFFER}/Stats", SpanKind.SERVER)
    assert client.parent.span_id == caller.get_span_context().span_id
    assert server.parent.span_id == client.context.span_id  # carried by the metadata, not in-process
    assert server.parent.is_remote
    inner_client = only("rft.v1.Liveness/Progress", SpanKind.CLIENT)
    inner_server = only("rft.v1.Liveness/Progress", SpanKind.SERVER)
    assert inner_client.parent.span_id == server.context.span_id
    assert inner_server.parent.span_id == inner_client.context.span_id
    put = only(f"{BUFFER}/PutExperiences", SpanKind.SERVER)  # a client stream: injected, no client span
    assert put.parent.span_id == caller.get_span_context().span_id
    assert not [s for s in spans if s.name.startswith("grpc.")]  # health checks make no spans


async def test_refused_call_has_its_span_and_no_tracing_means_no_spans(exporter):
    server = await start_server([liveness.registration()], auth_token="secret")
    try:
        async with create_channel(server.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await liveness_pb2_grpc.LivenessStub(channel).Progress(liveness_pb2.ProgressRequest())
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        (span,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
        assert span.name == "rft.v1.Liveness/Progress" and not span.status.is_ok
    finally:
        await server.stop(0)
    tracing.shutdown_tracing()
    exporter.clear()
    plain = await start_server([liveness.registration()])
    try:
        async with create_channel(plain.address) as channel:
            await liveness_pb2_grpc.LivenessStub(channel).Progress(liveness_pb2.ProgressRequest())
    finally:
        await plain.stop(0)
    assert exporter.get_finished_spans() == ()
