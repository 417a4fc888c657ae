"""The vllm engine: a clear error without vLLM (runs everywhere); generation with exact-contract
log-probs and a weight update where vLLM and a GPU exist."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from services.common.config import InferenceModelConfig
from services.explorer.engines import ENGINES

from .fakes import sampling

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown when vLLM is missing")
def test_missing_vllm_is_a_clear_error(tiny_model_dir):
    with pytest.raises(RuntimeError, match=r"vLLM is not installed.*engine_type: hf"):
        ENGINES.get("vllm")(InferenceModelConfig(engine_type="vllm"), str(tiny_model_dir))


def test_worker_extension_imports_without_vllm():
    from services.explorer.engines.vllm_worker import WeightSyncExtension

    assert hasattr(WeightSyncExtension, "rft_join_group") and hasattr(WeightSyncExtension, "rft_receive")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM or not torch.cuda.is_available(), reason="needs vLLM and a CUDA GPU")
async def test_vllm_generates_with_logprobs_and_loads_weights(tiny_model_dir):
    from services.explorer.engines.vllm import VLLMEngine

    cfg = InferenceModelConfig(
        engine_type="vllm", gpu_memory_utilization=0.3, dtype="float32", enforce_eager=True
    )
    engine = VLLMEngine.from_config(cfg, str(tiny_model_dir))
    try:
        prompt = engine.tokenizer.encode("1+2=")
        outs = await engine.generate([prompt], sampling(temperature=0.8, max_tokens=8, n=2))
        assert len(outs[0]) == 2 and all(len(o.token_ids) == len(o.logprobs) for o in outs[0])
        assert all((o.logprobs <= 0).all() for o in outs[0])
        from services.common.modeling import load_model

        model = load_model(tiny_model_dir)
        await engine.load_weights([(n, p * 0.5) for n, p in model.named_parameters()], version=2)
        again = await engine.generate([prompt], sampling(temperature=0, max_tokens=4))
        assert again[0][0].model_version == 2
    finally:
        await engine.close()
