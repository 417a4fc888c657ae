"""An explorer on a real grpc.aio server streams to a real buffer service: every experience arrives
complete (bit-equal to what was produced), whole groups, across backpressure from a full buffer.
Also the weight RPCs (memory chunks and a gloo broadcast group), Eval, Status and Shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import grpc
import pytest
import torch
from rft.v1 import explorer_pb2, explorer_pb2_grpc

from launcher.tiny_model import make_tiny_model
from services.buffer.service import build_core as build_buffer_core
from services.buffer.servicer import registration as buffer_registration
from services.common.buffer_client import BufferClient
from services.common.config import load_config
from services.common.experience import experiences_equal, from_proto
from services.common.rpc import create_channel, start_server
from services.explorer.service import build_core
from services.explorer.servicer import ExplorerServicer, registration
from services.explorer.sink import BufferSink
from services.explorer.workflows.arithmetic import make_arithmetic_rows
from services.weight_sync import BroadcastGroup, GroupInfo, free_port, specs_of, state_dict_to_chunks


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_model(tmp_path_factory.mktemp("explorer_grpc") / "model")


def _config(tmp_path, model_dir, *, capacity=10000, on_full="reject", rows=8, batch=2, evals=False):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(rows, seed=1)))
    eval_spec = (
        f"[{{name: arith, path: {data}, repeat_times: 2, default_workflow_type: arithmetic,"
        " format: {prompt_key: question, response_key: answer}}]"
        if evals
        else "[]"
    )
    return load_config(
        text=f"""
mode: both
checkpoint_root_dir: {tmp_path}/ckpt
algorithm: {{repeat_times: 2}}
model: {{model_path: {model_dir}, max_response_tokens: 6}}
buffer:
  batch_size: {batch}
  explorer_input:
    taskset: {{path: {data}, default_workflow_type: arithmetic, format: {{prompt_key: question, response_key: answer}}}}
    eval_tasksets: {eval_spec}
  trainer_input: {{experience_buffer: {{capacity: {capacity}}}}}
explorer: {{eval_on_startup: false, rollout_model: {{micro_batch_size: 8}}}}
monitor: {{monitor_type: none}}
services: {{buffer: {{on_full: {on_full}, consumer_groups: [trainer]}}}}
"""
    )


class RecordingSink(BufferSink):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent = []

    async def put(self, experiences):
        await super().put(experiences)
        self.sent.extend(experiences)


async def _serve(config, sink_factory=None):
    buffer_core = build_buffer_core(config)
    await buffer_core.start()
    buffer = await start_server([buffer_registration(buffer_core)])
    channel = create_channel(buffer.address, timeout_s=10)
    client = BufferClient(channel, producer_id="ex-a", consumer_group="trainer", consumer="t0")
    sink = RecordingSink(client, vocab_size=512, initial_backoff_s=0.01, max_backoff_s=0.05)
    core = await build_core(config, explorer_id="ex-a", sink=sink)
    stopped = asyncio.Event()
    explorer = await start_server([registration(ExplorerServicer(core, on_shutdown=stopped.set))])
    exp_channel = create_channel(explorer.address, timeout_s=60)
    return buffer_core, buffer, channel, client, core, explorer, exp_channel, stopped


async def _close(buffer_core, buffer, channel, core, explorer, exp_channel):
    await exp_channel.close()
    await explorer.stop(0)
    await core.close()
    await channel.close()
    await buffer.stop(0)
    await buffer_core.close()


async def test_explorer_streams_complete_experiences_to_the_buffer(tmp_path, model_dir):
    config = _config(tmp_path, model_dir, evals=True)
    buffer_core, buffer, channel, client, core, explorer, exp_channel, stopped = await _serve(config)
    try:
        stub = explorer_pb2_grpc.ExplorerServiceStub(exp_channel)
        resp = await stub.Explore(explorer_pb2.ExploreRequest(steps=0))
        assert resp.step == 4 and resp.experiences == 16 and not resp.continue_exploring
        assert "rollout/reward/mean" in resp.metrics and "rollout/tokens_per_s" in resp.metrics
        got = []
        while len(got) < 16:
            leased = await client.get_batch(16, timeout_ms=2000)
            got.extend(from_proto(e) for e in leased.experiences)
            await client.ack(leased.lease_id)
        sent = {e.eid.uid: e for e in core.sink.sent}
        assert len(sent) == 16 and {e.eid.uid for e in got} == set(sent)
        for e in got:
            assert experiences_equal(e, sent[e.eid.uid])
            assert e.logprobs.shape == e.action_mask.shape == (e.response_length,) and e.reward is not None
            assert e.eid.explorer_id == "ex-a" and e.model_version == 0
        groups = {}
        for e in got:
            groups.setdefault(e.eid.group_id, []).append(e)
        assert len(groups) == 8 and all(len(g) == 2 for g in groups.values())

        ev = await stub.Eval(explorer_pb2.EvalRequest())
        assert "eval/arith/reward/mean@2" in ev.metrics and "eval/arith/pass@2" in ev.metrics
        status = await stub.Status(explorer_pb2.ExplorerStatusRequest())
        assert status.explorer_id == "ex-a" and status.step == 4 and status.rollout_workers == 1
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Eval(explorer_pb2.EvalRequest(tasksets=["nope"]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await stub.Shutdown(explorer_pb2.ExplorerShutdownRequest())
        assert stopped.is_set()
    finally:
        await _close(buffer_core, buffer, channel, core, explorer, exp_channel)


async def test_backpressure_slows_the_explorer_and_loses_nothing(tmp_path, model_dir):
    config = _config(tmp_path, model_dir, capacity=4, rows=8, batch=2)
    buffer_core, buffer, channel, client, core, explorer, exp_channel, _ = await _serve(config)
    try:
        stub = explorer_pb2_grpc.ExplorerServiceStub(exp_channel)
        explore = asyncio.ensure_future(stub.Explore(explorer_pb2.ExploreRequest(steps=0)))
        deadline = asyncio.get_running_loop().time() + 60
        while core.sink.stats()["backpressure_waits"] < 1:  # step 2 finds the buffer full (capacity 4)
            assert asyncio.get_running_loop().time() < deadline and not explore.done()
            await asyncio.sleep(0.01)  # ok-sleep: polling with a deadline
        assert core.step == 1
        got = []
        while len(got) < 16:  # a trainer that takes one step's worth at a time
            leased = await client.get_batch(4, timeout_ms=5000)
            got.extend(from_proto(e) for e in leased.experiences)
            await client.ack(leased.lease_id)
        resp = await explore
        assert resp.experiences == 16 and len(got) == 16
        assert len({e.eid.uid for e in got}) == 16
    finally:
        await _close(buffer_core, buffer, channel, core, explorer, exp_channel)


async def test_weights_by_memory_chunks_and_by_broadcast(tmp_path, model_dir):
    config = _config(tmp_path, model_dir)
    buffer_core, buffer, channel, client, core, explorer, exp_channel, _ = await _serve(config)
    try:
        stub = explorer_pb2_grpc.ExplorerServiceStub(exp_channel)
        model = core.engines[0].model
        new = {n: torch.randn_like(p) for n, p in model.state_dict().items() if n != "lm_head.weight"}  # tied
        chunks = state_dict_to_chunks(new, 5, chunk_bytes=64 << 10)
        assert len(chunks) > 1

        async def stream():
            for c in chunks:
                yield c

        resp = await stub.LoadWeights(stream())
        assert resp.version.version == 5 and resp.bytes > 0
        for n, t in new.items():
            assert torch.equal(model.state_dict()[n], t), n
        assert (await stub.Status(explorer_pb2.ExplorerStatusRequest())).model_version.version == 5

        # broadcast: the "trainer" (rank 0) in a thread of this process, the explorer joins as rank 1
        sd = {n: torch.randn_like(p) for n, p in model.state_dict().items() if n != "lm_head.weight"}
        info = GroupInfo(
            "127.0.0.1", free_port(), 2, specs=tuple(specs_of(sd)), generation=1, timeout_s=30, backend="gloo"
        )
        sender: dict = {}
        ready = threading.Event()

        def trainer():
            group = BroadcastGroup.join(info, 0)
            ready.set()
            sender["stats"] = group.send(7, sd)
            group.close()

        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        setup = await stub.SetupWeightSyncGroup(
            explorer_pb2.ExplorerSetupWeightSyncGroupRequest(group=info.to_proto(), rank_offset=1)
        )
        assert list(setup.ranks) == [1]
        got = await stub.ReceiveWeights(explorer_pb2.ExplorerReceiveWeightsRequest(version=7))
        await asyncio.to_thread(thread.join, 30)
        assert got.version.version == 7 and sender["stats"].version == 7
        for n, t in sd.items():
            assert torch.equal(model.state_dict()[n], t), n
        await stub.TeardownWeightSyncGroup(explorer_pb2.ExplorerTeardownWeightSyncGroupRequest(generation=1))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ReceiveWeights(explorer_pb2.ExplorerReceiveWeightsRequest(version=8))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # experiences after the sync carry the new version
        resp = await stub.Explore(explorer_pb2.ExploreRequest(steps=1))
        assert core.sink.sent[-1].model_version == 7
    finally:
        await _close(buffer_core, buffer, channel, core, explorer, exp_channel)
