"""The vllm engine's weight loads and sleep mode without vLLM: what crosses `collective_rpc` survives a
msgpack round trip unchanged (vLLM's transport is msgspec msgpack, which rebuilds tensors only in fields
typed as tensors), the worker extension rebuilds identical tensors from it, loads a full state dict
through vLLM's in-place reload (post-load processing), completes a subset (strict=False) with the rest of
the model folder's tensors and reloads it whole, refuses a subset for a quantized model, and ties and
processes a tied output layer again after a reload; the engine sleeps when the explorer says an explore
step's generation is done and wakes before the next generation or weight load. vLLM's own side of each
is held by scripts/vllm_api_rules.py; the real engine's is tests/vllm_engine."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import safetensors.torch
import torch
from rft.v1 import common_pb2

from services.explorer.engines.vllm import VLLMEngine
from services.explorer.engines.vllm_worker import QuantizedPartialLoadError, WeightSyncExtension, tied_layers
from services.explorer.engines.weights_shm import read_shared_weights, write_shared_weights
from services.explorer.weight_receiver import WeightReceiver
from services.weight_sync import (
    BroadcastGroup,
    GroupInfo,
    StaleGenerationError,
    TensorSpec,
    WeightLoadError,
    free_port,
)

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


class TiedModel(torch.nn.Module):
    """An input embedding and an output layer holding its weight (tied embeddings), as vLLM builds them;
    the output layer's `quant_method` records the post-load processing it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(7, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 7, bias=False)
        self.head.weight = self.embed.weight
        self.processed: list[torch.nn.Module] = []
        self.head.quant_method = SimpleNamespace(process_weights_after_loading=self.processed.append)


class FakeWorker(WeightSyncExtension):
    """The attributes vLLM's worker gives the extension, on the CPU; records what it reloads. Its
    `reload_weights` replaces every tensor as vLLM's layerwise reload does (new parameter objects),
    which unties a tied layer."""

    def __init__(self, quantization: str | None = None, folder: str | Path = ""):
        self.device, self.rank = torch.device("cpu"), 0
        self.model_config = SimpleNamespace(quantization=quantization, model=str(folder))
        self.reloaded: list[tuple[str, torch.Tensor]] = []
        self.reloads = 0
        self.model_runner = SimpleNamespace(model=TiedModel())

    def reload_weights(self, weights_iterator=None, is_checkpoint_format=True):
        assert is_checkpoint_format
        self.reloads += 1
        self.reloaded += list(weights_iterator)
        embed = self.model_runner.model.embed
        embed.weight = torch.nn.Parameter(embed.weight.detach().clone() + 1)


class FakeLLM:
    """An AsyncLLM whose collective_rpc sends its arguments through msgpack to a FakeWorker."""

    def __init__(self, worker: FakeWorker | None):
        self.worker = worker
        self.events: list[str] = []
        self.files: list[str] = []
        self.sent: list[tuple[str, list]] = []
        self.entered: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)  # set as a method is sent

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.events.append(method)
        self.entered[method].set()
        sent = _round_trip(list(args))
        assert sent == list(args), f"{method}: the transport changed its arguments"
        self.sent.append((method, sent))
        self.files += [a["path"] for a in sent if isinstance(a, dict)]
        if self.worker is None:
            return [0]
        # the worker runs apart from the engine's loop, as vLLM's worker processes do
        return [await asyncio.to_thread(getattr(self.worker, method), *sent)]

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
    assert engine.model_version == 3
    assert llm.events == ["rft_load_shared", "reset_prefix_cache"]
    assert llm.files and not any(Path(f).exists() for f in llm.files)  # the shared file is removed


async def test_the_group_payloads_survive_the_transport():
    engine = ScriptedVLLM(FakeLLM(None), CharTokenizer(), vocab_size=256)
    spec = TensorSpec("w", torch.bfloat16, (2, 3))
    info = GroupInfo("127.0.0.1", 29500, 3, specs=(spec,), generation=4, backend="gloo")
    await engine.join_weight_group(info, rank_offset=1)
    await engine.receive_weights(7)
    await engine.leave_weight_group()
    (join, (raw, offset, path, join_token)), receive, leave = engine.llm.sent
    assert join == "rft_join_group" and offset == 1
    assert GroupInfo.from_proto(common_pb2.WeightSyncGroupInfo.FromString(raw)) == info
    # each join and receive carries the call-off file and a token of its own
    assert receive == ("rft_receive", [7, path, join_token + 1]) and leave == ("rft_leave", [])
    assert engine.model_version == 7


def _group_of_two() -> GroupInfo:
    spec = TensorSpec("w", torch.float32, (2, 3))
    return GroupInfo("127.0.0.1", free_port(), 2, specs=(spec,), generation=3, backend="gloo", timeout_s=600)


async def test_a_called_off_receive_reaches_the_worker_and_gives_up_within_seconds():
    """The worker blocks in a broadcast whose sender never sends (the group's timeout is 10 minutes);
    the explorer abandons it as the synchronizer's call-off makes it (`WeightReceiver.abandon`), and
    the worker, in its own thread beyond the engine's `collective_rpc`, gives up within seconds."""
    worker = FakeWorker()
    engine = _engine(worker)
    receiver = WeightReceiver(SimpleNamespace(engines=[engine], status="RUNNING"))  # as the explorer's
    info = _group_of_two()
    host = asyncio.create_task(asyncio.to_thread(BroadcastGroup.join, info, 0))
    assert await receiver.setup(info, rank_offset=1) == [1]
    sender = await host
    receive = asyncio.create_task(receiver.receive(5))
    await engine.llm.entered["rft_receive"].wait()  # the worker's receive has been sent
    called_off = time.monotonic()
    receiver.abandon()
    with pytest.raises(StaleGenerationError, match="receive was called off"):
        await asyncio.wait_for(receive, 30)
    assert time.monotonic() - called_off < 10
    assert engine.model_version == 0 and worker.reloads == 0
    engine.abandon_weights()  # no receive in progress: nothing to call off
    assert await receiver.teardown(0)
    await asyncio.to_thread(sender.close)
    await engine.close()
    assert not engine._call_off.path.parent.exists()


async def test_a_called_off_join_reaches_the_worker():
    """Rank 0 never comes (its trainer died before hosting): the join's abandon reaches the worker."""
    engine = _engine()
    abandon = threading.Event()
    join = asyncio.create_task(engine.join_weight_group(_group_of_two(), 1, abandon))
    abandon.set()
    called_off = time.monotonic()
    with pytest.raises(StaleGenerationError, match="join was called off"):
        await asyncio.wait_for(join, 30)
    assert time.monotonic() - called_off < 10
    await engine.close()


async def test_a_subset_is_completed_from_the_model_folder_and_reloaded_whole(tiny_model_dir):
    """strict=False (a LoRA run's merged layers): the given tensors first, then every other tensor of
    the model folder (the frozen base), all through vLLM's reload; a given name is not read again."""
    folder = safetensors.torch.load_file(str(tiny_model_dir / "model.safetensors"))
    name = "model.layers.0.mlp.up_proj.weight"
    merged = [(name, folder[name] + 1)]
    engine = _engine(FakeWorker(folder=tiny_model_dir))
    await engine.load_weights(merged, version=4, strict=False)
    reloaded = engine.llm.worker.reloaded
    _same(reloaded[:1], merged)
    rest = sorted(n for n in folder if n != name)
    assert sorted(n for n, _ in reloaded[1:]) == rest
    for n, t in reloaded[1:]:
        assert torch.equal(t, folder[n]), n
    assert engine.model_version == 4 and engine.llm.events == ["rft_load_shared", "reset_prefix_cache"]


async def test_a_subset_with_no_model_folder_weights_to_complete_it_is_an_error(tmp_path):
    engine = _engine(FakeWorker(folder=tmp_path))
    with pytest.raises(WeightLoadError, match="no \\*.safetensors files"):
        await engine.load_weights(_weights()[1:3], version=4, strict=False)
    assert engine.model_version == 0 and engine.llm.worker.reloads == 0  # refused before the reload


async def test_a_quantized_model_refuses_a_subset(tiny_model_dir):
    quantized = _engine(FakeWorker(quantization="fp8", folder=tiny_model_dir))
    with pytest.raises(QuantizedPartialLoadError, match="quantized \\(fp8\\).*lora_adapter"):
        await quantized.load_weights(_weights()[1:3], version=5, strict=False)
    assert quantized.model_version == 0 and quantized.llm.worker.reloads == 0
    assert not any(Path(f).exists() for f in quantized.llm.files)
    await quantized.load_weights(_weights(), version=6)  # a full state dict is fine: vLLM reprocesses it
    assert quantized.model_version == 6


async def test_a_tied_output_layer_is_tied_again_and_processed_after_a_reload():
    """vLLM's reload gives the embedding a new weight and leaves the tied output layer on the old one:
    the layer gets the embedding's new weight again and its post-load processing runs once."""
    engine = _engine()
    model = engine.llm.worker.model_runner.model
    old = model.embed.weight
    await engine.load_weights(_weights()[:1], version=1)
    assert model.embed.weight is not old
    assert model.head.weight is model.embed.weight and model.processed == [model.head]


def test_tied_layers_finds_each_layer_holding_another_layers_weight():
    model = TiedModel()
    assert tied_layers(model) == [(model.head, model.embed)]
    model.head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())  # untied
    assert tied_layers(model) == []


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
