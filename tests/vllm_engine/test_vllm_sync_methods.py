"""Weights into the live vLLM engine by every weight-sync method, through the explorer's real receiving path.

Each test runs a synchronizer (a real `grpc.aio` server on port 0) for one method. The trainer's side is
driven from the test as the trainer does it (`TrainerSyncHook` around a sync that sends through the
method's strategy, services/trainer/weight_sync.py); the explorer's side is wired as the explorer service
wires it (`attach_synchronizer`): an `ExplorerCore` holding the shared engine, its `WeightReceiver`, the
method's fetch and the sync gate, whose `before_step` fetches the version and loads it into the engine
(`load_weights`, or `join_weight_group` + `receive_weights` for `nccl`, its gloo group on the CPU).

After each load the engine's log-probs on fixed tokens equal the trainer's (the HF model with the same
weights in float32, within 1e-5) and differ from the old weights'. Covered: `memory` (once also against
a fresh engine started from a folder holding the same weights), `memory` with the bf16 wire, memory
deltas, `checkpoint` files and checkpoint deltas, `nccl` (and a broadcast the synchronizer calls off
while the engine's worker waits in it), `lora_adapter` (merged layers loaded with
strict=False, completed from the model folder), and a load that changes only the input embedding,
which the tied output layer must follow. Each test puts the folder's weights back (`restore_weights`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from services.common.config import RFTConfig
from services.common.config.sync_plan import SyncPlan
from services.common.rpc import create_channel, start_server
from services.explorer.core import ExplorerCore
from services.explorer.settings import ExplorerSettings
from services.explorer.sink import ListSink
from services.explorer.weight_receiver import WeightReceiver
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.servicer import registration
from services.synchronizer.settings import SynchronizerSettings
from services.weight_sync import (
    Receiver,
    Sender,
    StaleGenerationError,
    TransportOptions,
    make_transport,
    specs_of,
    sync_method,
)
from services.weight_sync.member.client import SyncClient
from services.weight_sync.member.explorer_gate import ExplorerSyncGate
from services.weight_sync.member.trainer_hook import TrainerSyncHook
from tests.vllm_engine.conftest import (
    TOLERANCE,
    assert_engine_holds,
    engine_config,
    engine_logprobs,
    fixed_sequences,
    hf_model,
    restore_weights,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

TIMEOUT_S = 60.0


@dataclass
class Published:
    """What the trainer's sync returns to its hook (as `SyncResult`)."""

    version: int
    step: int
    checkpoint_path: str = ""


class Policy:
    """The trainer's weights: the HF model of the folder, changed in place by `step` (a tied pair is
    one parameter, so it stays tied)."""

    def __init__(self, model_dir: Path):
        self.model = hf_model(model_dir)

    def step(
        self, seed: int, frac: float = 1.0, scale: float = 0.05, only: str = ""
    ) -> dict[str, torch.Tensor]:
        """Move `frac` of the weights (of the parameter `only`, if given) by noise of `scale`; returns
        a copy of the new state dict."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if only and name != only:
                    continue
                mask = torch.rand(p.shape, generator=g) < frac
                p.add_(mask * torch.randn(p.shape, generator=g) * scale)
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


class SyncRun:
    """One method's weight sync between the test (the trainer) and the explorer around `engine`."""

    def __init__(self, engine, model_dir: Path, tmp: Path):
        self.engine, self.model_dir, self.tmp = engine, model_dir, tmp
        self._closers: list = []

    async def start(self, method: str, *, wire: str = "auto", delta: bool = True) -> SyncRun:
        self.method = sync_method(method, wire)
        self.core = SynchronizerCore(
            SynchronizerSettings(method=self.method, plan=SyncPlan("fixed", 1, 0), sync_timeout=TIMEOUT_S)
        )
        await self.core.start()
        server = await start_server([registration(self.core)], port=0)
        self._closers += [self.core.close, lambda: server.stop(0)]
        self.trainer = await self._client(server.address, "trainer", "trainer", address="127.0.0.1:0")
        self.client = await self._client(
            server.address, "e0", "explorer", workers=self.engine.workers, delta_pulls=delta
        )
        # the trainer's side (services/trainer/weight_sync.py): the method sends through these
        self.options = TransportOptions(
            timeout_s=TIMEOUT_S, checkpoint_dir=str(self.tmp / "state_dicts"), delta=delta
        )
        self.nccl = make_transport("nccl", self.options)
        self._closers.append(lambda: asyncio.to_thread(self.nccl.finalize))
        self.hook = TrainerSyncHook(
            self.trainer, self.method, self._send, specs=self._specs, join_group=self._join,
            abandon=lambda: self.nccl.group.abandon() if self.nccl.group else None,
        )  # fmt: skip
        # the explorer's side, wired as services/explorer/service.py attach_synchronizer does
        settings = ExplorerSettings.from_config(RFTConfig(checkpoint_root_dir=str(self.tmp / "ckpt")))
        self.explorer = ExplorerCore(settings, engines=[self.engine], sink=ListSink(), explorer_id="e0")
        self.receiver = WeightReceiver(self.explorer)
        self._closers.append(lambda: self.receiver.teardown(0))
        self.fetch = self.method.fetch(
            self.client, Receiver(self.explorer.load_weights, self.receiver, str(self.model_dir))
        )
        self.gate = ExplorerSyncGate(self.client, self.fetch, timeout_s=TIMEOUT_S, method=self.method)
        self.explorer.gate = self.gate
        return self

    async def _client(self, target: str, member_id: str, role: str, **kw) -> SyncClient:
        client = SyncClient(
            create_channel(target, timeout_s=10), member_id, role, timeout_s=10,
            sync_timeout_s=TIMEOUT_S, owns_channel=True, **kw,
        )  # fmt: skip
        await client.register()
        self._closers.append(client.close)
        return client

    async def _specs(self):
        return specs_of(self.method.encode(self.state))

    async def _join(self, info, rank, abandon=None):
        await asyncio.to_thread(self.nccl.build_group, info, rank, abandon)

    async def _send(self) -> Published:
        sender = Sender(
            self.options, self.nccl if self.nccl.group is not None else None, self.trainer.push_chunks
        )
        delivery = await self.method.send(sender, self.version, self.version, self.state)
        return Published(self.version, self.version, delivery.path)

    async def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """The trainer publishes `state` as `version` after its step `version`, while the explorer's
        gate holds step `version + 1` (it needs that version) and loads it into the engine."""
        self.state, self.version = dict(state), version
        metrics, _ = await asyncio.wait_for(
            asyncio.gather(self.hook.after_step(version), self.gate.before_step(version + 1, 0)), TIMEOUT_S
        )
        await self.gate.settle()
        assert metrics["sync/model_version"] == version
        assert self.engine.model_version == version and self.explorer.model_version == version
        assert self.core.members["e0"].model_version == version  # the load was reported

    async def close(self) -> None:
        for close in reversed(self._closers):
            await close()


@pytest_asyncio.fixture(loop_scope="session")
async def sync_run(vllm_engine, vllm_model_dir, hf_base, tmp_path):
    """`await sync_run(method, ...)` -> a started `SyncRun`; closed, and the folder's weights put back
    into the engine, after the test."""
    runs: list[SyncRun] = []

    async def start(method: str, **kw) -> SyncRun:
        runs.append(SyncRun(vllm_engine, vllm_model_dir, tmp_path))
        return await runs[-1].start(method, **kw)

    try:
        yield start
    finally:
        for run in runs:
            await run.close()
        await restore_weights(vllm_engine, vllm_model_dir)
    await assert_engine_holds(vllm_engine, hf_base)  # the folder's weights are back (no lm_head.weight there)


async def test_memory(sync_run, vllm_engine, vllm_model_dir, hf_base):
    run = await sync_run("memory", delta=False)
    state = Policy(vllm_model_dir).step(seed=1)
    await run.publish(state, 1)
    await assert_engine_holds(vllm_engine, hf_model(vllm_model_dir, state), old=hf_base)
    assert run.client.pulled_bytes_full > 0


async def test_memory_bf16_wire(sync_run, vllm_engine, vllm_model_dir, hf_base):
    """The trainer sends float32 weights as bfloat16; the engine holds their bf16 rounding."""
    run = await sync_run("memory", wire="bfloat16", delta=False)
    state = Policy(vllm_model_dir).step(seed=2)
    await run.publish(state, 1)
    received = run.method.as_received(state)
    assert any(not torch.equal(received[k], state[k]) for k in state)  # rounded on the wire
    await assert_engine_holds(vllm_engine, hf_model(vllm_model_dir, received), old=hf_base)


async def test_memory_deltas(sync_run, vllm_engine, vllm_model_dir):
    """Version 1 is pulled whole, version 2 (5% of the weights moved) as the delta from version 1."""
    run = await sync_run("memory")
    policy = Policy(vllm_model_dir)
    first = policy.step(seed=3)
    await run.publish(first, 1)
    full = run.client.pulled_bytes_full
    second = policy.step(seed=4, frac=0.05)
    await run.publish(second, 2)
    assert run.client.pulled_bytes_full == full and 0 < run.client.pulled_bytes_delta < full / 2
    await assert_engine_holds(
        vllm_engine, hf_model(vllm_model_dir, second), old=hf_model(vllm_model_dir, first)
    )


@pytest.mark.parametrize("delta", [False, True], ids=["files", "deltas"])
async def test_checkpoint(sync_run, vllm_engine, vllm_model_dir, hf_base, delta):
    """Safetensors files the trainer publishes under the run's state_dicts/; with deltas the second
    version is read as the delta from the first."""
    run = await sync_run("checkpoint", delta=delta)
    policy = Policy(vllm_model_dir)
    first = policy.step(seed=5)
    await run.publish(first, 1)
    await assert_engine_holds(vllm_engine, hf_model(vllm_model_dir, first), old=hf_base)
    second = policy.step(seed=6, frac=0.05)
    await run.publish(second, 2)
    await assert_engine_holds(
        vllm_engine, hf_model(vllm_model_dir, second), old=hf_model(vllm_model_dir, first)
    )
    assert (run.fetch.bytes_delta > 0) == delta and run.fetch.bytes_full > 0


async def test_nccl_broadcast_into_the_engines_workers(sync_run, vllm_engine, vllm_model_dir, hf_base):
    """The trainer (rank 0) broadcasts through the group the synchronizer hands out; the engine's worker
    joins it with its own rank and receives (gloo on the CPU); twice, in the same group."""
    run = await sync_run("nccl")
    policy = Policy(vllm_model_dir)
    first = policy.step(seed=7)
    await run.publish(first, 1)
    assert run.receiver.generation == run.core.rendezvous.generation
    await assert_engine_holds(vllm_engine, hf_model(vllm_model_dir, first), old=hf_base)
    second = policy.step(seed=8)
    await run.publish(second, 2)
    await assert_engine_holds(
        vllm_engine, hf_model(vllm_model_dir, second), old=hf_model(vllm_model_dir, first)
    )


async def test_a_called_off_broadcast_reaches_the_engines_workers(sync_run, vllm_engine, vllm_model_dir):
    """The trainer is restarted while the engine's worker waits in a broadcast the old trainer will never
    send (the group's timeout is TIMEOUT_S): the synchronizer calls it off, the explorer's heartbeats see
    it, and the call-off reaches the worker (vLLM's engine core is blocked in the `collective_rpc` that
    runs the receive), which gives it up within seconds; the engine keeps its weights and serves."""
    run = await sync_run("nccl")
    first = Policy(vllm_model_dir).step(seed=9)
    await run.publish(first, 1)
    wait = asyncio.create_task(run.client.wait_for_version(step=3, timeout_s=20))
    decision = await run.trainer.request_sync(step=2, timeout_s=20)
    answer = await wait
    assert decision.accepted and answer.receive_broadcast
    # the explorer's BroadcastFetch over its WeightReceiver: the receive starts at once, and the call-off
    # can land only after two of the fetch's heartbeats (a second apart) have seen it
    fetch = asyncio.create_task(run.fetch(answer))
    await run.trainer.register()  # the trainer's new process: the broadcast is over
    called_off = time.monotonic()
    with pytest.raises(StaleGenerationError, match="called"):
        await asyncio.wait_for(fetch, TIMEOUT_S - 10)
    assert time.monotonic() - called_off < 20
    assert [e.detail for e in run.core.history if e.kind == "called off"] == [
        f"generation {decision.generation}: trainer registered again"
    ]
    assert vllm_engine.model_version == 1
    await assert_engine_holds(vllm_engine, hf_model(vllm_model_dir, first))


def _adapter(base: Mapping[str, torch.Tensor], seed: int, rank: int = 4, scaling: float = 2.0):
    """A LoRA adapter on every attention q/v and MLP down projection, as the trainer sends it, and the
    merged weights W + scaling * B @ A it stands for."""
    g = torch.Generator().manual_seed(seed)
    adapter, merged = {}, {}
    for name, w in base.items():
        if not name.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight")):
            continue
        out_f, in_f = w.shape
        a = torch.randn(rank, in_f, generator=g) * 0.2
        b = torch.randn(out_f, rank, generator=g) * 0.2
        adapter |= {
            f"{name}#lora_A": a,
            f"{name}#lora_B": b,
            f"{name}#lora_scaling": torch.tensor([scaling]).double(),
        }
        merged[name] = w + scaling * (b @ a)
    return adapter, merged


async def test_lora_adapter_merged_layers_are_completed_from_the_model_folder(
    sync_run, vllm_engine, vllm_model_dir, hf_base
):
    """Only the adapter travels; the explorer merges it into the base weights and loads the merged
    layers alone (strict=False), which the worker completes from the model folder. A second adapter
    replaces the first (merged into the base, not into the first merge)."""
    run = await sync_run("lora_adapter")
    base = {k: v.detach().clone() for k, v in hf_base.state_dict().items()}
    adapter, merged = _adapter(base, seed=9)
    await run.publish(adapter, 1)
    first = hf_model(vllm_model_dir, merged, strict=False)
    await assert_engine_holds(vllm_engine, first, old=hf_base)
    adapter, merged = _adapter(base, seed=10)
    await run.publish(adapter, 2)
    await assert_engine_holds(vllm_engine, hf_model(vllm_model_dir, merged, strict=False), old=first)


async def test_a_load_that_changes_the_embedding_changes_the_tied_output_layer(
    sync_run, vllm_engine, vllm_model_dir, hf_base
):
    """The tiny model ties its output layer to the input embedding. A load that changes only the
    embedding, naming it once (as a tied model's folder stores it: no lm_head.weight), must change the
    output layer too: vLLM's reload gives the tied layer no weights of its own, so the CPU backend's
    packed copy of it (its oneDNN GEMM handle) stayed on the old weights, log-probs off by up to 1.4,
    until the worker re-tied and processed it again (vllm_worker.py `reprocess_tied`). A load naming
    lm_head.weight as well gets the layer processed by vLLM itself, so it would not show this."""
    run = await sync_run("memory", delta=False)
    state = Policy(vllm_model_dir).step(seed=11, only="model.embed_tokens.weight")
    assert "lm_head.weight" not in dict(hf_base.named_parameters())  # one parameter for both layers
    del state["lm_head.weight"]
    await run.publish(state, 1)
    await assert_engine_holds(vllm_engine, hf_model(vllm_model_dir, state), old=hf_base)


async def test_a_loaded_engine_matches_a_fresh_engine_on_the_same_weights(
    sync_run, vllm_engine, vllm_model_dir, hf_base, tmp_path
):
    """The live engine after a memory load and a fresh engine started from a folder holding the same
    weights: the same log-probs on fixed tokens (within 1e-5) and the same greedy samples."""
    from services.common.modeling import load_tokenizer
    from services.explorer.engines.vllm import VLLMEngine
    from tests.unit.explorer.fakes import sampling

    run = await sync_run("memory", delta=False)
    state = Policy(vllm_model_dir).step(seed=12)
    await run.publish(state, 1)
    folder = tmp_path / "trained"
    hf_model(vllm_model_dir, state).save_pretrained(folder)
    load_tokenizer(vllm_model_dir).save_pretrained(folder)
    fresh = VLLMEngine.from_config(engine_config(), str(folder))
    try:
        for prompt, tokens in fixed_sequences(vllm_engine.tokenizer):
            live = await engine_logprobs(vllm_engine, prompt, tokens)
            torch.testing.assert_close(
                live, await engine_logprobs(fresh, prompt, tokens), rtol=0, atol=TOLERANCE
            )
        prompts = [prompt for prompt, _ in fixed_sequences(vllm_engine.tokenizer)]
        greedy = sampling(temperature=0.0, max_tokens=16, ignore_eos=True)
        live_outs, fresh_outs = (
            await vllm_engine.generate(prompts, greedy),
            await fresh.generate(prompts, greedy),
        )
        for (a,), (b,) in zip(live_outs, fresh_outs, strict=True):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=TOLERANCE)
    finally:
        await fresh.close()
