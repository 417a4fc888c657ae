"""The vllm engine's weight loads and sleep mode without vLLM: what crosses `collective_rpc` survives a
msgpack round trip unchanged (vLLM's transport is msgspec msgpack, which rebuilds tensors only in fields
typed as tensors), the worker extension rebuilds identical tensors from it, loads a full state dict
through vLLM's in-place reload (post-load processing) and refuses a subset for a quantized model; the
engine sleeps when the explorer says an explore step's generation is done and wakes before the next
generation or weight load. vLLM's own side of each is held by scripts/vllm_api_rules.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import safetensors.torch
import torch
from rft.v1 import common_pb2

from services.common.weight_sync import GroupInfo, TensorSpec
from services.explorer.engines.vllm import VLLMEngine
from services.explorer.engines.vllm_worker import QuantizedPartialLoadError, WeightSyncExtension
from services.explorer.engines.weights_shm import read_shared_weights, write_shared_weights

from .fakes import CharTokenizer, sampling


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(7, 4, generator=g).to(torch.bfloat16)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(4, 6, generator=g).t()),  # not contiguous
        ("model.norm.weight", torch.randn(4, generator=g).half()),
        ("model.scale", torch.tensor(3.5)),  # 0-d
        ("model.ids", torch.arange(5, dtype=torch.int64)),
        ("model.mask", torch.tensor([True, False, True])),
        ("model.empty", torch.zeros(0, 3)),
    ]


def _same(got: list[tuple[str, torch.Tensor]], want: list[tuple[str, torch.Tensor]]) -> None:
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name


def _round_trip(obj):
    """vLLM's collective_rpc transport, minus its tensor hooks: anything not plain fails to encode."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(obj))


def test_the_payload_survives_msgpack_and_rebuilds_identical_tensors(tmp_path):
    want = _weights()
    payload = write_shared_weights(want, folder=tmp_path)
    try:
        assert _round_trip(payload) == payload  # plain: str, bool, lists of str / int
        got = list(read_shared_weights(_round_trip(payload)))
        _same(got, want)
        on_disk = safetensors.torch.load_file(payload["path"])  # the file is standard safetensors
        _same([(n, on_disk[n]) for n, _ in want], want)
    finally:
        Path(payload["path"]).unlink()


def test_a_tensor_does_not_survive_the_transport():
    with pytest.raises(TypeError):
        _round_trip(([("w", torch.ones(2))],))


class FakeWorker(WeightSyncExtension):
    """The attributes vLLM's GPU worker gives the extension, on the CPU; records what it loads."""

    def __init__(self, quantization: str | None = None):
        self.device, self.rank = torch.device("cpu"), 0
        self.model_config = SimpleNamespace(quantization=quantization)
        self.reloaded: list[tuple[str, torch.Tensor]] = []
        self.loaded: list[tuple[str, torch.Tensor]] = []
        self.model_runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._direct))

    def reload_weights(self, weights_iterator=None, is_checkpoint_format=True):
        assert is_checkpoint_format
        self.reloaded += list(weights_iterator)

    def _direct(self, weights):
        self.loaded += list(weights)
        return {n for n, _ in self.loaded}


class FakeLLM:
    """An AsyncLLM whose collective_rpc sends its arguments through msgpack to a FakeWorker."""

    def __init__(self, worker: FakeWorker | None):
        self.worker = worker
        self.events: list[str] = []
        self.files: list[str] = []
        self.sent: list[tuple[str, list]] = []

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.events.append(method)
        sent = _round_trip(list(args))
        assert sent == list(args), f"{method}: the transport changed its arguments"
        self.sent.append((method, sent))
        self.files += [a["path"] for a in sent if isinstance(a, dict)]
        return [getattr(self.worker, method)(*sent) if self.worker is not None else 0]

    async def reset_prefix_cache(self):
        self.events.append("reset_prefix_cache")

    async def sleep(self, level=1):
        self.events.append(f"sleep({level})")

    async def wake_up(self, tags=None):
        self.events.append("wake_up")

    def shutdown(self):
        pass


class ScriptedVLLM(VLLMEngine):
    """The engine with generation replaced (it needs vLLM); records whether the engine was awake."""

    async def _one(self, prompt, params):
        self.llm.events.append("generate asleep" if self.asleep else "generate")
        return []


def _engine(worker: FakeWorker | None = None, sleep_mode: bool = False) -> ScriptedVLLM:
    return ScriptedVLLM(
        FakeLLM(worker or FakeWorker()), CharTokenizer(), vocab_size=256, sleep_mode=sleep_mode
    )


async def test_load_weights_reaches_the_worker_through_msgpack_and_vllms_reload():
    engine = _engine()
    want = _weights()
    await engine.load_weights(want, version=3)
    worker, llm = engine.llm.worker, engine.llm
    _same(worker.reloaded, want)  # full state dict: vLLM's in-place reload (post-load processing)
    assert worker.loaded == [] and engine.model_version == 3
    assert llm.events == ["rft_load_shared", "reset_prefix_cache"]
    assert llm.files and not any(Path(f).exists() for f in llm.files)  # the shared file is removed


async def test_the_group_payloads_survive_the_transport():
    engine = ScriptedVLLM(FakeLLM(None), CharTokenizer(), vocab_size=256)
    spec = TensorSpec("w", torch.bfloat16, (2, 3))
    info = GroupInfo("127.0.0.1", 29500, 3, specs=(spec,), generation=4, backend="gloo")
    await engine.join_weight_group(info, rank_offset=1)
    await engine.receive_weights(7)
    await engine.leave_weight_group()
    (join, (raw, offset)), receive, leave = engine.llm.sent
    assert join == "rft_join_group" and offset == 1
    assert GroupInfo.from_proto(common_pb2.WeightSyncGroupInfo.FromString(raw)) == info
    assert receive == ("rft_receive", [7]) and leave == ("rft_leave", [])
    assert engine.model_version == 7


async def test_a_subset_loads_directly_and_a_quantized_model_refuses_it():
    engine = _engine()
    subset = _weights()[1:3]
    await engine.load_weights(subset, version=4, strict=False)
    _same(engine.llm.worker.loaded, subset)
    assert engine.llm.worker.reloaded == []

    quantized = _engine(FakeWorker(quantization="fp8"))
    with pytest.raises(QuantizedPartialLoadError, match="quantized \\(fp8\\).*lora_adapter"):
        await quantized.load_weights(subset, version=5, strict=False)
    assert quantized.model_version == 0 and not any(Path(f).exists() for f in quantized.llm.files)
    await quantized.load_weights(_weights(), version=6)  # a full state dict is fine: vLLM reprocesses it
    assert quantized.model_version == 6


async def test_sleep_mode_sleeps_after_generation_and_wakes_before_the_next_use():
    engine = _engine(sleep_mode=True)
    await engine.generate([[1, 2]], sampling(n=2, max_tokens=4))
    await engine.sleep()
    await engine.sleep()  # already asleep: nothing more
    await engine.load_weights(_weights()[:1], version=1)  # wakes first
    await engine.sleep()
    await engine.generate([[1, 2]], sampling(n=2, max_tokens=4))
    assert engine.llm.events == [
        "generate", "sleep(1)", "wake_up", "rft_load_shared", "reset_prefix_cache",
        "sleep(1)", "wake_up", "generate",
    ]  # fmt: skip


async def test_sleep_waits_for_running_generations():
    started, release = asyncio.Event(), asyncio.Event()

    class Slow(ScriptedVLLM):
        async def _one(self, prompt, params):
            started.set()
            await release.wait()
            self.llm.events.append("generate asleep" if self.asleep else "generate")
            return []

    engine = Slow(FakeLLM(FakeWorker()), CharTokenizer(), vocab_size=256, sleep_mode=True)
    gen = asyncio.create_task(engine.generate([[1]], sampling(max_tokens=4)))
    await started.wait()
    sleeping = asyncio.create_task(engine.sleep())
    for _ in range(1000):  # polling with a bound: the sleep is queued behind the generation
        if engine._gate._updating:
            break
        await asyncio.sleep(0)  # ok-sleep: a yield to the loop inside a bounded poll
    assert engine._gate._updating and engine.llm.events == []
    release.set()
    await asyncio.gather(gen, sleeping)
    assert engine.llm.events == ["generate", "sleep(1)"]


async def test_without_sleep_mode_sleep_does_nothing():
    engine = _engine(sleep_mode=False)
    await engine.sleep()
    await engine.generate([[1]], sampling(max_tokens=4))
    assert engine.llm.events == ["generate"] and not engine.asleep
