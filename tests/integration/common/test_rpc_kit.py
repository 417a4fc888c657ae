"""The server kit on a real grpc.aio server on port 0: health, reflection, token, deadlines, graceful stop."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rft.v1 import buffer_pb2, buffer_pb2_grpc

from services.common.rpc import create_channel, start_server

SERVICE = "rft.v1.BufferService"


class SlowStats(buffer_pb2_grpc.BufferServiceServicer):
    """Stats answers at once; GetBatch blocks until released (to test deadlines and graceful stop)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def Stats(self, request, context):
        return buffer_pb2.StatsResponse(size=7, store="test")

    async def GetBatch(self, request, context):
        self.entered.set()
        await self.release.wait()
        return buffer_pb2.GetBatchResponse(lease_id="done")


async def _start(servicer, **kw):
    return await start_server(
        [(buffer_pb2_grpc.add_BufferServiceServicer_to_server, servicer, SERVICE)], **kw
    )


async def test_health_and_reflection():
    handle = await _start(SlowStats())
    try:
        async with create_channel(handle.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for name in ("", SERVICE):
                resp = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(ch)
            call = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = set()
            async for resp in call:
                names |= {s.name for s in resp.list_services_response.service}
            assert SERVICE in names and "grpc.health.v1.Health" in names
    finally:
        await handle.stop(0)


async def test_token_enforced_when_set():
    handle = await _start(SlowStats(), auth_token="s3cret")
    try:
        async with create_channel(handle.address) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # health stays open for orchestrator probes
            resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        async with create_channel(handle.address, auth_token="wrong") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with create_channel(handle.address, auth_token="s3cret") as ch:
            resp = await buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest(), timeout=5)
            assert resp.size == 7
    finally:
        await handle.stop(0)


async def test_deadline_honoured():
    servicer = SlowStats()
    handle = await _start(servicer)
    try:
        async with create_channel(handle.address) as ch:
            stub = buffer_pb2_grpc.BufferServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetBatch(buffer_pb2.GetBatchRequest(), timeout=0.3)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        async with create_channel(handle.address, timeout_s=0.3) as ch:  # channel default deadline
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await buffer_pb2_grpc.BufferServiceStub(ch).GetBatch(buffer_pb2.GetBatchRequest())
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        servicer.release.set()
        await handle.stop(0)


async def test_graceful_stop_finishes_inflight_call():
    servicer = SlowStats()
    handle = await _start(servicer)
    async with create_channel(handle.address) as ch:
        call = asyncio.ensure_future(
            buffer_pb2_grpc.BufferServiceStub(ch).GetBatch(buffer_pb2.GetBatchRequest(), timeout=10)
        )
        await asyncio.wait_for(servicer.entered.wait(), 5)
        stopping = asyncio.ensure_future(handle.stop(grace=5))
        # health flips to NOT_SERVING before the in-flight call is let through
        await asyncio.wait_for(_until_not_serving(handle), 5)
        servicer.release.set()
        resp = await call
        await stopping
        assert resp.lease_id == "done"
        assert handle.stopped.is_set()


async def _until_not_serving(handle):
    while True:
        resp = await handle.health.Check(health_pb2.HealthCheckRequest(service=SERVICE), None)
        if resp.status == health_pb2.HealthCheckResponse.NOT_SERVING:
            return
        await asyncio.sleep(0.01)  # ok-sleep: polling with a deadline (wait_for above)


async def test_large_messages_pass_64mib_limits():
    class Big(SlowStats):
        async def Stats(self, request, context):
            return buffer_pb2.StatsResponse(store="x" * (8 << 20))

    handle = await _start(Big())
    try:
        async with create_channel(handle.address) as ch:
            resp = await buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest(), timeout=10)
            assert len(resp.store) == 8 << 20
    finally:
        await handle.stop(0)
