"""Memory and checkpoint methods over a real synchronizer server: bit-exact weights of the tiny
Qwen2, aborted pushes, two explorers, checkpoint paths, the hook adapters end to end."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.modeling import load_model
from services.weight_sync import (
    CheckpointStore,
    WeightSyncError,
    load_weights,
    state_dict_to_chunks,
    sync_method,
)
from services.weight_sync.member.client import SyncWaitTimeout
from services.weight_sync.member.explorer_gate import ExplorerSyncGate
from services.weight_sync.member.trainer_hook import TrainerSyncHook
from services.weight_sync.methods.builtin import CheckpointFetch, MemoryFetch

MEMORY = sync_method("memory")  # typed once, as a settings record does


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("sync_tiny") / "model")


def perturbed_state_dict(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """New weights for `model` (perturbed in place; tied weights stay tied), as a detached copy."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.dtype))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bit_equal(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    got = model.state_dict()
    for name, tensor in state_dict.items():
        assert torch.equal(got[name].view(torch.uint8), tensor.contiguous().view(torch.uint8)), name


async def test_synchronizer_memory_push_pull_bit_exact_two_explorers(tiny_dir, sync_server, sync_clients):
    core, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    explorers = [await sync_clients(address, f"e{i}", "explorer") for i in range(2)]
    source = load_model(tiny_dir)
    new = perturbed_state_dict(source, seed=1)
    resp = await trainer.push_weights(new, version=1, step=1, chunk_bytes=64 << 10)
    assert resp.model_version.version == 1 and resp.bytes > 0 and len(core.weights.chunks) > 3
    for explorer in explorers:
        model = load_model(tiny_dir)
        version, state_dict = await explorer.pull_weights()
        assert version.version == 1
        load_weights(model, state_dict)
        assert_bit_equal(model, new)
    state = await trainer.get_run_state()
    assert state.model_version.version == 1 and len(state.members) == 3 and state.sync_method == "memory"


async def test_synchronizer_memory_aborted_or_broken_push_changes_nothing(
    tiny_dir, sync_server, sync_clients
):
    core, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    first = perturbed_state_dict(load_model(tiny_dir), seed=1)
    await trainer.push_weights(first, version=1, chunk_bytes=64 << 10)
    kept = core.weights
    chunks = state_dict_to_chunks(perturbed_state_dict(load_model(tiny_dir), seed=2), 2, chunk_bytes=64 << 10)

    with pytest.raises(grpc.aio.AioRpcError) as err:  # the stream ends early
        await trainer.push_chunks(chunks[:-1])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ended after" in err.value.details()
    assert core.published.version == 1 and core.weights is kept

    sent = asyncio.Event()

    async def stalled():
        for c in chunks[:3]:
            yield c
        sent.set()
        await asyncio.Event().wait()  # never finishes: the client cancels the call

    call = trainer.stub.PushWeights(stalled(), timeout=20)
    await asyncio.wait_for(sent.wait(), 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert core.published.version == 1 and core.weights is kept
    _, sd = await trainer.pull_weights()
    assert all(torch.equal(sd[k], v) for k, v in first.items())


async def test_synchronizer_checkpoint_notify_then_wait_returns_path(
    tmp_path, tiny_dir, sync_server, sync_clients
):
    _, address = await sync_server(method="checkpoint")
    trainer = await sync_clients(address, "trainer", "trainer")
    explorer = await sync_clients(address, "e0", "explorer")
    waiting = asyncio.create_task(explorer.wait_for_version(step=2, timeout_s=10))  # fixed 1/0: needs v1
    new = perturbed_state_dict(load_model(tiny_dir), seed=3)
    path = CheckpointStore(tmp_path / "state_dicts").save(1, new)
    await trainer.notify_checkpoint(1, 1, str(path))
    answer = await asyncio.wait_for(waiting, 10)
    assert (answer.model_version.version, answer.model_version.checkpoint_path) == (1, str(path))
    model = load_model(tiny_dir)

    async def load(named, version):
        load_weights(model, named)

    assert await CheckpointFetch(load)(answer) == 1
    assert_bit_equal(model, new)


async def test_synchronizer_hook_and_gate_move_memory_weights(tiny_dir, sync_server, sync_clients):
    """The trainer hook publishes after each step; the explorer gate holds step 2 until version 1 is loaded."""
    core, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    explorer = await sync_clients(address, "e0", "explorer")
    source, target = load_model(tiny_dir), load_model(tiny_dir)
    loaded: list[int] = []

    async def publish():
        sd = perturbed_state_dict(source, seed=10 + core.trainer_step)
        await trainer.push_weights(sd, version=core.trainer_step, step=core.trainer_step)
        publish.last = sd

    class Result:
        def __init__(self, version):
            self.version, self.step, self.checkpoint_path = version, version, ""

    async def sync():
        await publish()
        return Result(core.trainer_step)

    async def load(named, version):
        load_weights(target, named)
        loaded.append(version)

    hook = TrainerSyncHook(trainer, MEMORY, sync)
    gate = ExplorerSyncGate(explorer, MemoryFetch(explorer, load), timeout_s=20, method=MEMORY)
    await gate.before_step(1, 0)  # nothing needed yet
    blocked = asyncio.create_task(gate.before_step(2, 0))
    await core.wait_until(lambda: core.members["e0"].status.name == "REQUIRE_SYNC", 10)
    metrics = await hook.after_step(1)
    assert metrics["sync/model_version"] == 1.0
    await asyncio.wait_for(blocked, 10)
    assert loaded == [1] and gate.held == 1
    await gate.settle()  # the load's report goes out while the step runs
    assert core.members["e0"].model_version == 1
    assert_bit_equal(target, publish.last)


async def test_gate_waits_while_the_trainer_moves_and_says_why_when_it_stops(
    tiny_dir, sync_server, sync_clients
):
    """A restarted trainer catching up: the explorer's wait outlasts its window while the trainer's step
    advances, and gives up (naming the version and where the trainer stands) once it stands still."""
    core, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    explorer = await sync_clients(address, "e0", "explorer")
    source, target = load_model(tiny_dir), load_model(tiny_dir)

    async def load(named, version):
        load_weights(target, named)

    gate = ExplorerSyncGate(explorer, MemoryFetch(explorer, load), timeout_s=1.0, method=MEMORY)

    def timeouts() -> int:
        return sum(1 for e in core.history if e.kind == "timeout" and e.member_id == "e0")

    waiting = asyncio.create_task(gate.before_step(3, 0))  # needs version 2
    for step in (1, 2):  # each window ends with the trainer one step further
        await core.wait_until(lambda s=step: timeouts() >= s, 10)
        await trainer.heartbeat(step=step)
    await core.wait_until(lambda: timeouts() >= 3, 10)
    assert not waiting.done()  # three windows, and still waiting: the trainer kept moving
    await trainer.push_weights(perturbed_state_dict(source, seed=3), version=2, step=2)
    await asyncio.wait_for(waiting, 10)
    assert gate.held == 2
    await gate.settle()

    with pytest.raises(SyncWaitTimeout, match=r"version >= 3 .*'trainer', RUNNING\) is at step 2"):
        await asyncio.wait_for(gate.before_step(4, 2), 20)


async def test_fully_async_gate_never_waits_and_takes_new_weights_at_the_next_step(
    tiny_dir, sync_server, sync_clients
):
    """fully_async: explore steps run with no weights published at all; once the trainer publishes
    (every sync_interval = 2 steps), the next step boundary loads the new version, and the gate's
    metrics keep the load apart from the (absent) wait."""
    core, address = await sync_server(method="memory", style="fully_async", interval=2)
    trainer = await sync_clients(address, "trainer", "trainer")
    explorer = await sync_clients(address, "e0", "explorer")
    source, target = load_model(tiny_dir), load_model(tiny_dir)
    loaded: list[int] = []

    class Result:
        def __init__(self, version):
            self.version, self.step, self.checkpoint_path = version, version, ""

    async def sync():
        sd = perturbed_state_dict(source, seed=20 + core.trainer_step)
        await trainer.push_weights(sd, version=core.trainer_step, step=core.trainer_step)
        sync.last = sd
        return Result(core.trainer_step)

    async def load(named, version):
        load_weights(target, named)
        loaded.append(version)

    hook = TrainerSyncHook(trainer, MEMORY, sync)
    gate = ExplorerSyncGate(explorer, MemoryFetch(explorer, load), timeout_s=20, method=MEMORY)
    for step in range(1, 6):  # far ahead of a trainer that has published nothing
        await asyncio.wait_for(gate.before_step(step, 0), 10)
    assert loaded == [] and gate.step_metrics()["time/load_weights"] == 0.0
    assert await hook.after_step(1) == {}  # not on the interval yet
    assert (await hook.after_step(2))["sync/model_version"] == 2.0
    await asyncio.wait_for(gate.before_step(6, 0), 10)
    assert loaded == [2] and gate.held == 2
    assert gate.step_metrics()["time/load_weights"] > 0.0
    await gate.settle()
    assert_bit_equal(target, sync.last)
    # the synchronizer never saw the explorer wait (a `wait` event is written whenever one blocks)
    assert [e for e in core.history if e.kind == "wait"] == []


async def test_pipelined_hook_sends_the_snapshot_while_the_next_step_trains(
    tiny_dir, sync_server, sync_clients
):
    """`pipeline_every`: after a step the hook only snapshots the weights and returns; the sync runs in
    the background while the next step changes the weights, and publishes the snapshot, not them. A
    failed background sync surfaces at the next step, whose own sync has started regardless."""
    core, address = await sync_server(method="memory", offset=1)
    trainer = await sync_clients(address, "trainer", "trainer")
    explorer = await sync_clients(address, "e0", "explorer")
    source, target = load_model(tiny_dir), load_model(tiny_dir)
    release, fail = asyncio.Event(), set()

    class Snap:
        def __init__(self, step):
            self.step = step
            self.state = {k: v.detach().clone() for k, v in source.state_dict().items()}

    class Result:
        def __init__(self, version):
            self.version, self.step, self.checkpoint_path = version, version, ""

    async def snapshot():
        return Snap(core.trainer_step)

    async def sync(snap=None):
        assert snap is not None, "a pipelined hook sends its snapshot"
        await release.wait()
        if snap.step in fail:
            raise WeightSyncError(f"send of step {snap.step} broke")
        await trainer.push_weights(snap.state, version=snap.step, step=snap.step)
        return Result(snap.step)

    hook = TrainerSyncHook(trainer, MEMORY, sync, snapshot=snapshot, pipeline_every=1)
    await trainer.heartbeat(step=1)
    assert await hook.after_step(1) == {}  # returned with the sync still waiting to send
    sent = {k: v.clone() for k, v in source.state_dict().items()}
    perturbed_state_dict(source, seed=7)  # step 2 trains meanwhile
    release.set()
    metrics = await hook.flush()
    assert metrics["sync/model_version"] == 1.0 and metrics["sync/pipelined"] == 1.0
    version, state_dict = await explorer.pull_weights()
    load_weights(target, state_dict)
    assert version.version == 1
    assert_bit_equal(target, sent)  # the snapshot, not the weights step 2 wrote

    fail.add(2)
    await trainer.heartbeat(step=2)
    assert await hook.after_step(2) == {}
    await trainer.heartbeat(step=3)
    with pytest.raises(WeightSyncError, match="step 2 broke"):
        await hook.after_step(3)
    assert (await hook.flush())["sync/model_version"] == 3.0  # step 3's sync went out all the same
    assert core.published.version == 3
