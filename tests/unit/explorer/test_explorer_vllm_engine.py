"""The vllm engine without vLLM: a clear error naming how to get it, and a worker extension that imports
anywhere. The real engine (generation, weight loads, in-flight updates) is tested in tests/vllm_engine,
from the vLLM environment."""

from __future__ import annotations

import importlib.util

import pytest

from services.common.config import InferenceModelConfig
from services.explorer.engines import ENGINES

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown when vLLM is missing")
def test_missing_vllm_is_a_clear_error(tiny_model_dir):
    with pytest.raises(RuntimeError, match=r"vLLM is not installed.*engine_type: hf"):
        ENGINES.get("vllm")(InferenceModelConfig(engine_type="vllm"), str(tiny_model_dir))


def test_worker_extension_imports_without_vllm():
    from services.explorer.engines.vllm_worker import WeightSyncExtension

    assert hasattr(WeightSyncExtension, "rft_join_group") and hasattr(WeightSyncExtension, "rft_receive")


def test_on_a_gpu_the_v1_model_runner_is_pinned_unless_the_user_chose(monkeypatch):
    import os

    from services.explorer.engines.vllm import gpu_environment

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    gpu_environment()
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # a user opts in to Model Runner V2
    gpu_environment()
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_vllm_attention_backend_from_the_environment_reaches_the_engine_args_only_when_set(monkeypatch):
    from services.explorer.engines.vllm import attention_backend

    monkeypatch.delenv("RFT_VLLM_ATTENTION_BACKEND", raising=False)
    assert attention_backend() == {}  # vLLM's own choice
    monkeypatch.setenv("RFT_VLLM_ATTENTION_BACKEND", "TRITON_ATTN")  # as scripts/gpu_vllm.sh sets it
    assert attention_backend() == {"attention_backend": "TRITON_ATTN"}
