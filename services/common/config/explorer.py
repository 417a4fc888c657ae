"""`explorer` section: rollout engine, auxiliary models, runners, retries and evaluation cadence."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from services.common.config.base import Section


class InferenceModelConfig(Section):
    """A rollout engine (`explorer.rollout_model`) or an auxiliary model (`explorer.auxiliary_models[i]`).

    `engine_type`: `hf` (transformers, CPU or GPU; the default) or `vllm` (GPU, optional extra).
    Auxiliary models may instead be reached over an OpenAI-compatible HTTP API (`api_base`).
    """

    engine_type: Literal["hf", "vllm", "openai"] = "hf"
    model_path: str | None = None
    name: str | None = None
    engine_num: int = Field(1, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    use_v1: bool = True
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    # Share of the GPU's memory the engine may take: vLLM's own setting; the hf engine caps its CUDA
    # allocator at it when set. Unset on a GPU shared with the trainer: SHARED_GPU_ROLLOUT_MEMORY
    # (resolved.py `rollout_model`), so the trainer fits beside it.
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    # vLLM: allocate through vLLM's sleep-mode allocator; on by default on a GPU shared with the trainer.
    enable_sleep_mode: bool = False
    # `auto`: bfloat16 on CUDA, float32 on CPU.
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    seed: int = 42
    max_model_len: int | None = Field(None, gt=0)
    max_prompt_tokens: int | None = Field(None, gt=0)
    max_response_tokens: int | None = Field(None, gt=0)
    chat_template: str | None = None
    enable_thinking: bool | None = None
    enable_history: bool = False
    enable_openai_api: bool = False
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    ignore_eos: bool = False
    # hf engine: sequences generated together per forward pass (bounds memory).
    micro_batch_size: int = Field(64, ge=1)
    # hf engine: sample with the lean forward pass for Llama-family models (lean_decoder.py); false,
    # or a model it does not support, keeps the transformers forward.
    lean_decoder: bool = True
    # openai engine: endpoint and the environment variable holding the key.
    api_base: str | None = None
    api_key_env: str | None = None


class OverRolloutConfig(Section):
    ratio: float = Field(0.0, ge=0, lt=1)
    wait_after_min: float = Field(30.0, ge=0)


class DynamicTimeoutConfig(Section):
    enable: bool = False
    ratio: float = Field(3.0, gt=0)


# `<job_dir>/run/<SERVE_URL_FILE>`: the endpoint URL, written by the explorer once it listens
SERVE_URL_FILE = "serve.url"


class ServeConfig(Section):
    """`explorer.serve`: the OpenAI-compatible endpoint of `mode: serve` (services/explorer/serve/).
    Loopback by default; port 0 takes a free port (`rft run` prints the bound URL)."""

    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    # the largest `max_tokens` a request may ask for, and the value when it asks none
    max_tokens: int = Field(1024, ge=1)
    max_body_bytes: int = Field(1_048_576, ge=1024)
    max_n: int = Field(16, ge=1)  # choices per request
    # sessions recorded and not yet committed; a call that would open one more gets 429
    max_open_sessions: int = Field(10000, ge=1)


class ExplorerConfig(Section):
    name: str = "explorer"
    runner_per_model: int = Field(8, ge=1)
    max_timeout: float = Field(1800, gt=0)
    max_retry_times: int = Field(2, ge=0)
    env_vars: dict[str, str] = {}
    concurrent_mode: Literal["sequential", "asynchronous", "multi-threading"] = "sequential"
    max_repeat_times_per_runner: int | None = Field(None, ge=1)
    eval_interval: int = Field(100, ge=1)
    eval_on_startup: bool = True
    bench_on_latest_checkpoint: bool = False
    rollout_model: InferenceModelConfig = InferenceModelConfig()
    auxiliary_models: list[InferenceModelConfig] = []
    over_rollout: OverRolloutConfig = OverRolloutConfig()
    dynamic_timeout: DynamicTimeoutConfig = DynamicTimeoutConfig()
    serve: ServeConfig = ServeConfig()
    service_status_check_interval: float = Field(60, gt=0)
    min_running_model_num: int = Field(1, ge=1)
    # Several explorers (shards i/n, e.g. `rft run --explorers n`): false, each explores
    # `buffer.batch_size` tasks per step; true, each explores batch_size / n, so one explore step of
    # every explorer together is one train batch (strictly on-policy with `sync_offset: 0`, and the
    # sampling of a batch is spread over n processes).
    split_batch: bool = False
    # Start exploring (bench mode: benchmarking) as soon as the service is up, instead of waiting for
    # Explore/Bench RPCs; the service stops itself when done.
    auto_start: bool = False
    # In-flight weight updates: a new weight version is applied between decode steps of the generations
    # running (the hf engine re-reads their prefix with the new weights; vLLM pauses, loads and resumes),
    # instead of after them, and the explorer fetches each version the trainer publishes while a step
    # samples. Every response token records the version that sampled it (Experience
    # `token_model_versions`); `model_version` stays the version a response started with.
    inflight_weight_update: bool = False

    @field_validator("auxiliary_models")
    @classmethod
    def _auxiliary_have_a_model(cls, models: list[InferenceModelConfig]) -> list[InferenceModelConfig]:
        for i, m in enumerate(models):
            if not m.model_path and not m.api_base:
                raise ValueError(f"auxiliary_models[{i}] needs model_path or api_base")
        return models
