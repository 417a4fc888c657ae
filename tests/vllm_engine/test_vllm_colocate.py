"""vLLM in a colocated run (`cluster.colocate`, gpu tier: vLLM's CPU build has no sleep mode): the engine
built from a colocated config's rollout model has sleep mode on; `sleep` hands its weights and KV cache
back to the device (the free memory rises by most of its reserve), a weight load wakes it, and greedy
samples after the wake are the ones before the sleep."""

from __future__ import annotations

import pytest
import torch

from services.common.config import load_config, resolve
from tests.unit.explorer.fakes import sampling
from tests.vllm_engine.conftest import EAGER, HAS_VLLM, needs_gpu, restore_weights

pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.gpu,
    needs_gpu("sleep mode"),
    pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed"),
]

COLOCATED = (
    "model: {max_response_tokens: 8}\n"
    "cluster: {colocate: true, gpu_per_node: 1}\n"
    "explorer: {rollout_model: {engine_type: vllm, dtype: float32, gpu_memory_utilization: 0.25,"
    f" enforce_eager: {str(EAGER).lower()}}}}}\n"
)


async def test_colocated_vllm_engine_sleeps_frees_its_reserve_and_wakes_on_a_load(vllm_model_dir):
    from services.explorer.engines.vllm import VLLMEngine

    rollout = resolve(load_config(text=COLOCATED, environ={})).rollout_model
    assert rollout.enable_sleep_mode
    engine = VLLMEngine.from_config(rollout, str(vllm_model_dir))
    try:
        prompts = [engine.tokenizer.encode(p) for p in ("1+2=", "7*8 is")]
        greedy = sampling(temperature=0.0, max_tokens=8)
        before = [[list(o.token_ids) for o in g] for g in await engine.generate(prompts, greedy)]
        free_awake = torch.cuda.mem_get_info()[0]
        await engine.sleep()
        free_asleep, total = torch.cuda.mem_get_info()
        assert engine.asleep
        assert free_asleep - free_awake > 0.5 * 0.25 * total  # most of the reserve is back
        await restore_weights(engine, vllm_model_dir)  # the colocated hand-over: load wakes it
        assert not engine.asleep
        after = [[list(o.token_ids) for o in g] for g in await engine.generate(prompts, greedy)]
        assert after == before
    finally:
        await engine.close()
