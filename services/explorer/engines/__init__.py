"""Rollout engines by name (`explorer.rollout_model.engine_type`): `hf` (transformers; CPU or CUDA) and
`vllm` (AsyncLLM; GPU, optional extra). A plug-in is a dotted path to a factory with the same
signature: `factory(model_config, model_path, *, index, device) -> RolloutEngine`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from services.common.config import InferenceModelConfig
from services.common.registry import Registry
from services.explorer.engines.base import GenerationOutput, RolloutEngine, SamplingParams

EngineFactory = Callable[..., RolloutEngine]
ENGINES: Registry[EngineFactory] = Registry("rollout engine")


@ENGINES.register("hf")
def _hf_engine(
    cfg: InferenceModelConfig, model_path: str, *, index: int = 0, device: str | None = None
) -> Any:
    from services.explorer.engines.hf import HFEngine

    return HFEngine.from_config(cfg, model_path, index=index, device=device)


@ENGINES.register("vllm")
def _vllm_engine(
    cfg: InferenceModelConfig, model_path: str, *, index: int = 0, device: str | None = None
) -> Any:
    from services.explorer.engines.vllm import VLLMEngine

    return VLLMEngine.from_config(cfg, model_path, index=index, device=device)


def build_engines(
    cfg: InferenceModelConfig,
    model_path: str,
    devices: Sequence[str | None] | None = None,
    first_index: int = 0,
) -> list[RolloutEngine]:
    """`engine_num` engines of `engine_type`, numbered from `first_index` (each seeded `seed + index`;
    explorer shard i starts at i x engine_num, so no two engines of a run share a random stream).
    `devices[i]` is engine i's device (its first GPU with tensor parallelism; placement.py); None
    lets the engine choose."""
    factory = ENGINES.get(cfg.engine_type)
    devices = list(devices) if devices is not None else [None] * cfg.engine_num
    return [factory(cfg, model_path, index=first_index + i, device=devices[i]) for i in range(cfg.engine_num)]


__all__ = ["ENGINES", "GenerationOutput", "RolloutEngine", "SamplingParams", "build_engines"]
