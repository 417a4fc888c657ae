"""Every TrainerService RPC on a real `grpc.aio` server (port 0), leasing from the real buffer service."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest
import torch
from rft.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc

from launcher.tiny_model import make_tiny_model
from services.buffer.service import build as build_buffer
from services.common.buffer_client import BufferClient
from services.common.rpc.client import create_channel
from services.common.rpc.server import start_server
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.service import build_core
from services.trainer.servicer import TrainerServicer, registration
from services.trainer.settings import TrainerSettings
from services.trainer.weight_sync import WeightSync
from services.weight_sync import BroadcastGroup, GroupInfo, TransportOptions, chunks_to_state_dict
from tests.support.trainer_data import make_config, make_experiences

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


class Harness:
    """Buffer server + trainer server in this process, and a stub to the trainer."""

    def __init__(self, model_dir: Path, root: Path):
        self.config = make_config(model_dir, root)
        self.pushed: list[common_pb2.WeightChunk] = []
        self.shutdown_called = asyncio.Event()

    async def start(self) -> Harness:
        registrations, self.close_buffer = await build_buffer(self.config)
        self.buffer_server = await start_server(registrations)
        self.buffer_channel = create_channel(self.buffer_server.address)
        self.producer = BufferClient(self.buffer_channel, producer_id="test-explorer")
        consumer = BufferClient(self.buffer_channel, consumer="trainer")
        info = ensure_process_group()
        engine = await asyncio.to_thread(FSDPEngine, TrainerSettings.from_config(self.config), info)
        self.core = build_core(self.config, info, engine, consumer, console=False)
        await self.core.prepare()

        async def push(chunks):
            self.pushed.extend(chunks)

        options = TransportOptions(
            checkpoint_dir=str(self.core.settings.job_dir / "state_dicts"), timeout_s=60
        )
        self.weight_sync = WeightSync(self.core, options=options, push=push)
        servicer = TrainerServicer(self.core, self.weight_sync, on_shutdown=self.shutdown_called.set)
        self.server = await start_server([registration(servicer)])
        self.channel = create_channel(self.server.address)
        self.stub = trainer_pb2_grpc.TrainerServiceStub(self.channel)
        return self

    async def stop(self) -> None:
        await self.weight_sync.close()
        await self.core.shutdown()
        for ch in (self.channel, self.buffer_channel):
            await ch.close()
        await self.server.stop(0)
        await self.buffer_server.stop(0)
        await self.close_buffer()


@pytest.fixture
async def harness(model_dir, tmp_path):
    h = await Harness(model_dir, tmp_path).start()
    yield h
    await h.stop()


async def expect_code(call, code: grpc.StatusCode, text: str = "") -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert text in info.value.details()


async def test_train_step_checkpoint_status_shutdown(harness):
    stub = harness.stub
    status = await stub.Status(trainer_pb2.StatusRequest())
    assert status.status == common_pb2.MEMBER_STATUS_RUNNING and status.step == 0 and status.world_size == 1
    assert (await stub.IsAlive(trainer_pb2.IsAliveRequest())).alive
    await harness.producer.put(make_experiences(16, group_size=4, seed=11))

    await expect_code(
        stub.TrainStep(trainer_pb2.TrainStepRequest(timeout_ms=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "timeout_ms",
    )
    for expected in (1, 2):
        reply = await stub.TrainStep(trainer_pb2.TrainStepRequest(timeout_ms=5000))
        assert reply.step == expected and reply.continue_training
        assert {"actor/pg_loss", "actor/grad_norm", "perf/throughput", "timing_s/step"} <= set(reply.metrics)
    stats = await harness.producer.stats()
    # trained, but held under the trainer's lease until a checkpoint holding the steps is durable
    assert stats.acked == 0 and stats.pending_leases == 2
    await expect_code(
        stub.TrainStep(trainer_pb2.TrainStepRequest(timeout_ms=50)), grpc.StatusCode.DEADLINE_EXCEEDED
    )

    saved = await stub.SaveCheckpoint(
        trainer_pb2.SaveCheckpointRequest(block_until_saved=True, save_as_hf=True)
    )
    assert saved.step == 2 and saved.path.endswith("global_step_2")
    stats = await harness.producer.stats()
    assert stats.acked == 16 and stats.pending_leases == 0
    assert (Path(saved.hf_path) / "model.safetensors").is_file()
    status = await stub.Status(trainer_pb2.StatusRequest())
    assert (
        status.step == 2 and status.last_checkpoint == saved.path and "actor/pg_loss" in status.last_metrics
    )

    await stub.Shutdown(trainer_pb2.ShutdownRequest(wait_for_save=True))
    await asyncio.wait_for(harness.shutdown_called.wait(), 10)
    assert not (await stub.IsAlive(trainer_pb2.IsAliveRequest())).alive
    assert (await stub.Status(trainer_pb2.StatusRequest())).status == common_pb2.MEMBER_STATUS_STOPPED
    await expect_code(stub.TrainStep(trainer_pb2.TrainStepRequest()), grpc.StatusCode.FAILED_PRECONDITION)
    await expect_code(
        stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest()), grpc.StatusCode.FAILED_PRECONDITION
    )
    await expect_code(stub.Shutdown(trainer_pb2.ShutdownRequest()), grpc.StatusCode.FAILED_PRECONDITION)
    await expect_code(
        stub.GetWeightSyncInfo(trainer_pb2.GetWeightSyncInfoRequest(receivers=1)),
        grpc.StatusCode.FAILED_PRECONDITION,
    )


async def test_weight_sync_rpcs(harness):
    stub = harness.stub
    await expect_code(
        stub.TeardownWeightSyncGroup(trainer_pb2.TeardownWeightSyncGroupRequest()),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    await expect_code(
        stub.SetupWeightSyncGroup(trainer_pb2.SetupWeightSyncGroupRequest()),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    await expect_code(
        stub.GetWeightSyncInfo(trainer_pb2.GetWeightSyncInfoRequest(receivers=0)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "receivers",
    )
    await expect_code(
        stub.SyncWeights(trainer_pb2.SyncWeightsRequest(method="nccl")), grpc.StatusCode.FAILED_PRECONDITION
    )
    info = await stub.GetWeightSyncInfo(trainer_pb2.GetWeightSyncInfoRequest(receivers=1))
    assert info.world_size == 2 and len(info.tensors) > 0 and info.generation == 1
    stale = common_pb2.WeightSyncGroupInfo()
    stale.CopyFrom(info)
    stale.generation = 7
    await expect_code(
        stub.SetupWeightSyncGroup(trainer_pb2.SetupWeightSyncGroupRequest(group=stale)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "generation",
    )

    expected = dict(harness.core.engine.iter_state_dict())
    received: dict[str, torch.Tensor] = {}
    joined = threading.Event()

    def receiver() -> None:
        with BroadcastGroup.join(GroupInfo.from_proto(info), rank=1) as group:
            joined.set()
            received.update({k: v.clone() for k, v in group.receive(0)})

    thread = threading.Thread(target=receiver)
    thread.start()
    reply = await stub.SetupWeightSyncGroup(trainer_pb2.SetupWeightSyncGroupRequest(group=info))
    assert reply.rank == 0
    synced = await stub.SyncWeights(trainer_pb2.SyncWeightsRequest(method="nccl"))
    await asyncio.to_thread(thread.join, 60)
    assert joined.is_set() and synced.version.version == 0 and synced.bytes > 0
    assert received.keys() == expected.keys() and all(torch.equal(received[k], expected[k]) for k in expected)
    await stub.TeardownWeightSyncGroup(trainer_pb2.TeardownWeightSyncGroupRequest(generation=info.generation))
    await expect_code(
        stub.TeardownWeightSyncGroup(trainer_pb2.TeardownWeightSyncGroupRequest()),
        grpc.StatusCode.FAILED_PRECONDITION,
    )

    await expect_code(
        stub.SyncWeights(trainer_pb2.SyncWeightsRequest(method="bogus")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "method",
    )
    by_file = await stub.SyncWeights(trainer_pb2.SyncWeightsRequest(method="checkpoint"))
    assert Path(by_file.version.checkpoint_path).exists()
    await stub.SyncWeights(trainer_pb2.SyncWeightsRequest(method="memory"))
    version, state = chunks_to_state_dict(harness.pushed)
    assert version.version == 0 and all(torch.equal(state[k], expected[k]) for k in state)
