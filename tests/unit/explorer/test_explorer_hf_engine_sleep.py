"""The hf engine's sleep mode (on in a colocated run, `cluster.colocate`): `sleep` really frees the
weights' storages (every parameter and buffer storage resized to zero, held in host copies), the next
generate or weight load wakes it, and a seeded generation after the wake equals the one before the
sleep; without sleep mode `sleep` does nothing. The CUDA test (gpu tier) checks the device's allocated
bytes drop to about nothing while asleep."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.common.config import load_config, resolve
from services.explorer.engines.hf import HFEngine

from .fakes import sampling

COLOCATED = "model: {max_response_tokens: 6}\ncluster: {colocate: true}\n"


def _storages(engine: HFEngine) -> list[torch.UntypedStorage]:
    return [t.untyped_storage() for t in [*engine.model.parameters(), *engine.model.buffers()]]


def _engine(model_dir, device: str = "cpu") -> HFEngine:
    rollout = resolve(load_config(text=COLOCATED, environ={})).rollout_model
    assert rollout.enable_sleep_mode  # a colocated run sleeps its engines
    return HFEngine.from_config(rollout, str(model_dir), device=device)


def _outputs(engine: HFEngine, seed: int) -> list[tuple[list[int], list[float]]]:
    engine.reseed(seed)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    groups = engine.generate_sync(prompts, sampling(temperature=1.0, max_tokens=6, n=2))
    return [
        (list(o.token_ids), [float(x) for x in (o.logprobs if o.logprobs is not None else [])])
        for g in groups
        for o in g
    ]


def test_sleep_frees_every_storage_and_wake_gives_the_same_seeded_outputs(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    before = _outputs(engine, seed=11)
    sizes = sum(st.nbytes() for st in {st.data_ptr(): st for st in _storages(engine)}.values())
    asyncio.run(engine.sleep())
    assert engine.asleep and all(st.nbytes() == 0 for st in _storages(engine))  # freed, not hidden
    assert sum(host.numel() for _, host in engine._parked) == sizes  # each storage once (tied weights)
    asyncio.run(engine.sleep())  # asleep already: nothing more
    assert _outputs(engine, seed=11) == before  # generate woke it, weights bit-exact
    assert not engine.asleep and all(st.nbytes() > 0 for st in _storages(engine))


def test_a_weight_load_wakes_the_engine_and_applies_the_new_weights(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    new = {k: v.detach().clone() * 0.5 for k, v in engine.model.state_dict().items()}
    asyncio.run(engine.sleep())
    asyncio.run(engine.load_weights(new.items(), version=3))
    assert not engine.asleep and engine._version == 3
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, new[k]), k
    asyncio.run(engine.sleep())
    asyncio.run(engine.wake_up())
    assert all(torch.equal(v, new[k]) for k, v in engine.model.state_dict().items())


def test_without_sleep_mode_sleep_does_nothing(tiny_model_dir):
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=3)
    asyncio.run(engine.sleep())
    assert not engine.asleep and all(st.nbytes() > 0 for st in _storages(engine))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_sleep_hands_the_weights_memory_back(tiny_model_dir):
    engine = _engine(tiny_model_dir, device="cuda:0")
    try:
        before = _outputs(engine, seed=5)
        torch.cuda.synchronize()
        awake = torch.cuda.memory_allocated(0)
        weights = sum(st.nbytes() for st in {st.data_ptr(): st for st in _storages(engine)}.values())
        asyncio.run(engine.sleep())
        asleep = torch.cuda.memory_allocated(0)
        assert awake - asleep >= weights  # every weight byte left the device
        assert _outputs(engine, seed=5) == before
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
