"""Bounds on every string and list of an `rft.v1` request, checked by the server kit for every service
(real grpc.aio servers on port 0, the generated servicer bases): a request over a bound is INVALID_ARGUMENT
naming the field, in a short message, and never reaches the servicer; one at the bound does. Unary,
client-streaming and server-streaming calls alike."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rft.v1 import common_pb2, explorer_pb2, explorer_pb2_grpc, trainer_pb2, trainer_pb2_grpc

from services.common.rpc import create_channel, start_server
from services.common.rpc.bounds import shown


class Trainer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def SyncWeights(self, request, context):
        self.calls.append(request.method)
        return trainer_pb2.SyncWeightsResponse()


class Explorer(explorer_pb2_grpc.ExplorerServiceServicer):
    def __init__(self) -> None:
        self.calls: list[object] = []

    async def Commit(self, request, context):
        self.calls.append(list(request.session_ids))
        return explorer_pb2.ServeCommitResponse()

    async def Feedback(self, request, context):
        self.calls.append(request.session_id)
        return explorer_pb2.ServeFeedbackResponse(session_id=request.session_id)

    async def LoadWeights(self, request_iterator, context):
        async for chunk in request_iterator:
            self.calls.append(chunk.index)
        return explorer_pb2.LoadWeightsResponse()


async def _refused(call, field: str, *texts: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details[:300]
    assert details.startswith(field + ":") and len(details) < 300, details[:300]
    for text in texts:
        assert text in details, details


@pytest.fixture
async def served():
    trainer, explorer = Trainer(), Explorer()
    handle = await start_server(
        [
            (trainer_pb2_grpc.add_TrainerServiceServicer_to_server, trainer, "rft.v1.TrainerService"),
            (explorer_pb2_grpc.add_ExplorerServiceServicer_to_server, explorer, "rft.v1.ExplorerService"),
        ]
    )
    channel = create_channel(handle.address, timeout_s=10)
    try:
        yield trainer, explorer, channel
    finally:
        await channel.close()
        await handle.stop(0)


async def test_strings_and_lists_over_their_bounds_never_reach_the_servicer(served):
    trainer, explorer, channel = served
    t = trainer_pb2_grpc.TrainerServiceStub(channel)
    e = explorer_pb2_grpc.ExplorerServiceStub(channel)
    await _refused(t.SyncWeights(trainer_pb2.SyncWeightsRequest(method="x" * 10_000)),
                   "method", "10000 characters, over the limit of 128")  # fmt: skip
    await _refused(e.Commit(explorer_pb2.ServeCommitRequest(session_ids=["s"] * 65_537)),
                   "session_ids", "65537 entries")  # fmt: skip
    await _refused(e.Commit(explorer_pb2.ServeCommitRequest(session_ids=["a", "s" * 1025])), "session_ids[1]")
    await _refused(e.Feedback(explorer_pb2.ServeFeedbackRequest(session_id="s" * 1025)), "session_id", "1024")
    chunk = common_pb2.WeightChunk(version=common_pb2.ModelVersion(version=1, checkpoint_path="p" * 4097))
    await _refused(e.LoadWeights(iter([chunk])), "version.checkpoint_path", "(stream message 0)")
    assert trainer.calls == [] and explorer.calls == []

    # at the bounds, every call goes through; other services (health) are not bounded by these tables
    await t.SyncWeights(trainer_pb2.SyncWeightsRequest(method="m" * 128))
    await e.Commit(explorer_pb2.ServeCommitRequest(session_ids=["s" * 1024] * 3))
    await e.LoadWeights(iter([common_pb2.WeightChunk(index=0, data=b"\0" * (1 << 20))]))
    assert trainer.calls == ["m" * 128] and explorer.calls == [["s" * 1024] * 3, 0]
    health = health_pb2_grpc.HealthStub(channel)
    assert (
        await health.Check(health_pb2.HealthCheckRequest())
    ).status == health_pb2.HealthCheckResponse.SERVING


def test_shown_cuts_a_value_to_64_characters_and_says_its_length():
    assert shown("abc") == "'abc'"
    long = shown("x" * 10_000)
    assert long == f"{'x' * 64!r}... (10000 characters)" and len(long) < 100
