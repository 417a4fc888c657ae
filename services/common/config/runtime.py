"""`synchronizer`, `trainer`, `monitor` and `log` sections: how weights move, how training runs, where metrics go."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from services.common.config.base import Section, normalise_alias
from services.common.config.sync_plan import STYLE_ALIASES, SyncStyle


class SynchronizerConfig(Section):
    """When and how weights move from the trainer to the explorers (Trinity-RFT meaning)."""

    # A weight-sync method's name or alias (nccl | memory | memory_bf16 | checkpoint | lora_adapter; online,
    # offline; or a plug-in 'package.module:Class'), checked against the one method registry
    # (services/weight_sync/method.py `SYNC_METHODS`, which owns the aliases) by `rft config
    # check` / `rft run`, and resolved there once into a `SyncMethod` in each service's settings record.
    sync_method: str = "nccl"
    # Backend of the broadcast group of the nccl method: `auto` (nccl on CUDA, gloo on CPU; gloo where
    # the trainer and the explorer share one GPU, resolved.py `weight_sync_backend`), `nccl` or `gloo`
    # (over loopback the bytes go through /dev/shm). `nccl` on a shared GPU is refused at load.
    group_backend: Literal["auto", "nccl", "gloo"] = "auto"
    sync_style: SyncStyle = "fixed"  # what each style means: services/common/config/sync_plan.py
    sync_interval: int = Field(1, ge=1)
    sync_offset: int = Field(0, ge=0)
    sync_timeout: float = Field(3600, gt=0)
    wait_for_checkpoint: bool = False
    # Bytes per flat bucket in a broadcast (nccl/gloo) and per gRPC chunk (memory).
    bucket_bytes: int = Field(64 << 20, ge=1 << 16)
    chunk_bytes: int = Field(4 << 20, ge=1 << 12, le=32 << 20)
    # Seconds of silence after which a member is marked lost.
    heartbeat_timeout: float = Field(60, gt=0)
    # Log a SHA-256 of the weights at every sync (trainer: what it sent; explorer: what its engines
    # hold after loading), to check bit-exact transfers; costs one pass over the weights.
    weight_digest: bool = False
    # The dtype weights travel in, for every method: `auto` = the trainer's training compute dtype (bf16
    # where it trains in bf16 mixed precision on CUDA, fp32 on CPU); `bfloat16` = fp32/fp64 tensors are
    # cast to bf16 before they are sent (half the bytes; the opt-in for fp32 training). Receivers cast
    # what arrives to their engine's dtype. `sync_method: memory_bf16` is `memory` with `bfloat16`.
    wire_dtype: Literal["auto", "bfloat16"] = "auto"
    # memory methods: after its first pull an explorer asks for a delta from the version it holds
    # (XOR of the wire words, zstd, a crc32 per tensor: services/weight_sync/wire/delta.py) and keeps
    # that payload in host memory (relays pass the deltas on); checkpoint: the trainer also writes each
    # version's delta from the one before beside its file and explorers read it (services/weight_sync/wire/files.py);
    # false: every pull and read is the full payload, and nothing is kept.
    delta_sync: bool = True
    # Pushed methods (memory, memory_bf16, lora_adapter): 0 = every explorer pulls each version from the
    # synchronizer (star); k = explorers relay it to each other down a k-ary tree rooted at the
    # synchronizer, which then sends k copies whatever the number of explorers
    # (services/weight_sync/tree/: plan.py, store.py, fetch.py).
    fanout: int = Field(0, ge=0)

    @field_validator("sync_style", mode="before")
    @classmethod
    def _style_alias(cls, value: Any) -> Any:
        return normalise_alias(value, STYLE_ALIASES)


class TrainerConfig(Section):
    """Training loop settings. `trainer_config` carries veRL-style nested settings through unchanged."""

    trainer_type: Literal["verl", "fsdp2"] = "fsdp2"
    trainer_strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    save_interval: int = Field(0, ge=0)
    enable_preview: bool = True
    total_steps: int | None = Field(None, ge=1)
    save_hf_checkpoint: Literal["last", "always", "never"] = "last"
    grad_clip: float = Field(1.0, gt=0)
    use_dynamic_bsz: bool = True
    max_token_len_per_gpu: int | None = Field(None, gt=0)
    ulysses_sequence_parallel_size: int = Field(1, ge=1)
    save_strategy: Literal["unrestricted", "single_thread", "single_process", "single_node"] = "unrestricted"
    max_checkpoints_to_keep: int | None = Field(None, ge=1)
    # `rft replay` (docs/replay.md): the trainer keeps the batch, metrics and a per-tensor weight digest
    # of its newest `replay_keep_steps` steps under <job_dir>/replay/ (0: none; one trainer process
    # only); `replay_keep_bytes` caps their size on disk (oldest dropped first; unset: no cap).
    replay_keep_steps: int = Field(0, ge=0)
    replay_keep_bytes: int | None = Field(None, ge=1)
    # Micro-batch size per device when use_dynamic_bsz is false.
    micro_batch_size_per_gpu: int = Field(8, ge=1)
    # Tokens per chunk of the LM head when computing log-probs and entropy: each chunk's fp32 logits
    # are made, used and recomputed in the backward pass, never all at once; 0 = all logits at once
    # (services/trainer/chunked_logprobs.py).
    logits_chunk_tokens: int = Field(4096, ge=0)
    # With several ranks, reduce-scatter the gradients once per optimizer step (after the last
    # micro-batch) instead of after every micro-batch; each rank then holds its full unsharded fp32
    # gradients while accumulating (services/trainer/fsdp.py `accumulate`; the memory plan counts it).
    # Unset: on where that costs little, for a LoRA adapter or on the CPU; off for a full model on GPUs.
    defer_grad_sync: bool | None = None
    # Number of trainer processes (torchrun --nproc_per_node); 1 runs without torchrun.
    nproc: int = Field(1, ge=1)
    # Hosts the trainer spans (torchrun --nnodes), each running `nproc` ranks of one FSDP2 group; each
    # node's rank and node 0's address come from its environment (services/trainer/nodes.py).
    nnodes: int = Field(1, ge=1)
    # Train as soon as the service is up (lease -> train -> commit -> ack -> sync per plan) until
    # total_steps or the explorers' end, then save + export and stop the service (exit code 0).
    auto_start: bool = False
    trainer_config: dict[str, Any] = {}


class TracingConfig(Section):
    """OpenTelemetry traces of every service (services/common/tracing.py, docs/traces.md). Off by default;
    the standard environment (`OTEL_TRACES_EXPORTER=otlp`, `OTEL_EXPORTER_OTLP_ENDPOINT`) turns it on too."""

    # Export spans over OTLP/HTTP (protobuf) from every service.
    enabled: bool = False
    # The collector's OTLP/HTTP address (e.g. `http://localhost:4318`; `/v1/traces` is added when missing).
    # Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`, else http://localhost:4318.
    endpoint: str | None = None
    # Fraction of traces kept (a trace started elsewhere keeps its caller's decision).
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)


class MonitorConfig(Section):
    """Metric sinks. Console and JSON lines always run; this adds one more backend."""

    monitor_type: Literal["none", "console", "tensorboard", "wandb", "mlflow"] = "console"
    monitor_args: dict[str, Any] = {}
    detailed_stats: bool = False
    # OpenTelemetry traces across the services (docs/traces.md).
    tracing: TracingConfig = TracingConfig()


class LogConfig(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Console rendering: `auto` = readable on a TTY, JSON otherwise.
    format: Literal["auto", "json", "console"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value
