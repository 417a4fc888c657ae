"""Where an explorer puts its engines among the GPUs it sees (the order its GPU share is sized by),
and the GPUs a vLLM engine's workers get from its device; on CPU, with GPU counts as numbers."""

from __future__ import annotations

import pytest

from services.common.config import ExplorerConfig
from services.explorer.engines.placement import engine_devices
from services.explorer.engines.vllm import engine_gpus


def _explorer(engine_num=2, tp=2, aux=()) -> ExplorerConfig:
    return ExplorerConfig(
        rollout_model={"engine_type": "vllm", "engine_num": engine_num, "tensor_parallel_size": tp},
        auxiliary_models=list(aux),
    )


def test_engines_then_auxiliary_models_on_the_visible_gpus():
    explorer = _explorer(aux=[{"model_path": "/m/judge"}, {"api_base": "http://x/v1", "name": "api"}])
    assert engine_devices(explorer, visible=5) == (["cuda:0", "cuda:2"], ["cuda:4", None])
    engines, _ = engine_devices(explorer, visible=8)  # more than needed: still from 0
    assert engines == ["cuda:0", "cuda:2"]


def test_without_enough_gpus_the_engines_choose():
    explorer = _explorer(aux=[{"model_path": "/m/judge"}])
    assert engine_devices(explorer, visible=0) == ([None, None], [None])  # CPU
    assert engine_devices(explorer, visible=4) == ([None, None], [None])  # needs 5


def test_a_vllm_engine_takes_tensor_parallel_size_gpus_from_its_device():
    assert engine_gpus("cuda:2", 2) == [2, 3]
    assert engine_gpus("cuda", 1) == [0]
    assert engine_gpus(None, 4) is None  # no placement: every visible GPU
    with pytest.raises(ValueError, match="CUDA GPUs"):
        engine_gpus("cpu", 1)
