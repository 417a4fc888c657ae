"""Config keys kept for Trinity-RFT / veRL compatibility that this project does not act on.

Every key of the tree is read by the code, or it is listed here with the reason:

- `REFUSED`: a value other than the default would silently give a different result than the user
  asks for (a feature that is not implemented), so `load_config` refuses it with the path, the
  reason and what to use instead.
- `WARNED`: harmless tuning that has no effect here (or means the same as the default); a value
  other than the default loads, and `rft config check`, `rft config show` and `rft run` print one
  warning line for it.

veRL keys under `trainer.trainer_config` are a free-form dict: those the trainer reads are
`TRAINER_CONFIG_KEYS` (services/trainer/settings.py reads them), those with a first-class key here
are refused with that key's name (`TRAINER_CONFIG_MOVED`), every other one loads with a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from services.common.config.algorithm import AlgorithmConfig, OptimizerConfig
from services.common.config.buffer import (
    DataSelectorConfig,
    ExperienceBufferConfig,
    FormatConfig,
    TasksetConfig,
)
from services.common.config.errors import Problem, format_path
from services.common.config.explorer import (
    DynamicTimeoutConfig,
    ExplorerConfig,
    InferenceModelConfig,
    OverRolloutConfig,
)
from services.common.config.model import LoRAConfig, ModelConfig
from services.common.config.root import RFTConfig
from services.common.config.runtime import MonitorConfig, SynchronizerConfig, TrainerConfig


@dataclass(frozen=True)
class Rule:
    """Why a key does nothing here, what to use instead, and when it matters: `applies(section, value)`
    (default: the value differs from the field's default)."""

    reason: str
    instead: str = ""
    applies: Callable[[Any, Any], bool] | None = None


def _vllm_only(name: str) -> Rule:
    def applies(section: Any, value: Any) -> bool:
        return section.engine_type != "vllm" and value != type(section).model_fields[name].default

    return Rule("a vLLM engine setting; engine_type 'hf' and 'openai' do not use it", "", applies)


_NOT_MULTIMODAL = "images and videos are not passed to the model (text-only engines and trainer)"

REFUSED: dict[tuple[type[BaseModel], str], Rule] = {
    (OptimizerConfig, "clip_grad"): Rule(
        "the trainer clips gradients with trainer.grad_clip", "trainer.grad_clip"
    ),
    (AlgorithmConfig, "sample_strategy"): Rule(
        "only `default` and `staleness_control` are implemented (no expert-data mixing, no plug-ins)",
        "sample_strategy: staleness_control with sample_strategy_args.max_staleness",
        lambda s, v: v not in ("default", "staleness_control"),
    ),
    (ModelConfig, "trust_remote_code"): Rule(
        "models are loaded without their own modeling code", "a model whose architecture transformers ships"
    ),
    (ModelConfig, "rope_scaling"): Rule(
        "not applied to the loaded model", "edit rope_scaling in the model folder's config.json"
    ),
    (ModelConfig, "rope_theta"): Rule(
        "not applied to the loaded model", "edit rope_theta in the model folder's config.json"
    ),
    (FormatConfig, "image_key"): Rule(_NOT_MULTIMODAL),
    (FormatConfig, "video_key"): Rule(_NOT_MULTIMODAL),
    (FormatConfig, "enable_concatenated_multi_turn"): Rule(
        "multi-turn rows are not concatenated from a taskset", "the multi_turn workflow with an environment"
    ),
    (DataSelectorConfig, "feature_keys"): Rule(
        "difficulty-based task selection is not implemented", "selector_type: sequential, shuffle or random"
    ),
    (DataSelectorConfig, "kwargs"): Rule(
        "difficulty-based task selection is not implemented", "selector_type: sequential, shuffle or random"
    ),
    (InferenceModelConfig, "enable_history"): Rule(
        "model call histories are not recorded; workflows build their experiences themselves"
    ),
    (InferenceModelConfig, "reasoning_parser"): Rule(
        "no reasoning parsing: thinking text stays in the content of an answer"
    ),
    (ExplorerConfig, "env_vars"): Rule(
        "not exported to the explorer's processes", "set the variables in the environment of `rft run`"
    ),
    (OverRolloutConfig, "ratio"): Rule(
        "over-rollout is not implemented: every task of an explore step is waited for",
        "explorer.max_timeout to bound slow tasks",
    ),
    (TrainerConfig, "ulysses_sequence_parallel_size"): Rule(
        "sequence parallelism is not implemented", "trainer.max_token_len_per_gpu to bound memory"
    ),
    (LoRAConfig, "lora_dtype"): Rule(
        "adapter weights are kept in the trainer's fp32 master dtype", "lora_dtype: auto"
    ),
}

WARNED: dict[tuple[type[BaseModel], str], Rule] = {
    (InferenceModelConfig, "enable_auto_tool_choice"): Rule(
        "tool calls are always parsed (with tool_call_parser) when a request or a workflow gives tools"
    ),
    (RFTConfig, "ignore_validator_suggestions"): Rule(
        "there are no validator suggestions; errors are errors"
    ),
    (OptimizerConfig, "optimizer_type"): Rule("`adam` and `adamw` both run AdamW (as Trinity-RFT)"),
    (TasksetConfig, "storage_type"): Rule("`file` is the only storage type"),
    (ExperienceBufferConfig, "storage_type"): Rule("`queue` is the only storage type"),
    (TasksetConfig, "max_retry_interval"): Rule("tasks are retried at once", "explorer.max_retry_times"),
    (TasksetConfig, "enable_progress_bar"): Rule("progress is shown by `rft run`"),
    (ExplorerConfig, "concurrent_mode"): Rule(
        "runners are always asyncio tasks", "explorer.runner_per_model"
    ),
    (ExplorerConfig, "max_repeat_times_per_runner"): Rule(
        "a task's repeats always run in one runner", "explorer.runner_per_model"
    ),
    (ExplorerConfig, "service_status_check_interval"): Rule(
        "engines are checked through gRPC health instead"
    ),
    (ExplorerConfig, "min_running_model_num"): Rule("a failed engine fails the explorer, which is restarted"),
    (InferenceModelConfig, "use_v1"): Rule("vLLM's V1 engine is the only one used"),
    (InferenceModelConfig, "enforce_eager"): _vllm_only("enforce_eager"),
    (InferenceModelConfig, "enable_prefix_caching"): _vllm_only("enable_prefix_caching"),
    (InferenceModelConfig, "enable_chunked_prefill"): _vllm_only("enable_chunked_prefill"),
    (InferenceModelConfig, "gpu_memory_utilization"): Rule(
        "an engine on this process's GPU sets it; a model behind an `api_base` does not use it",
        "",
        lambda section, value: (
            section.engine_type == "openai"
            and value != InferenceModelConfig.model_fields["gpu_memory_utilization"].default
        ),
    ),
    (InferenceModelConfig, "enable_sleep_mode"): _vllm_only("enable_sleep_mode"),
    (OverRolloutConfig, "wait_after_min"): Rule("over-rollout is not implemented"),
    (DynamicTimeoutConfig, "enable"): Rule("timeouts are fixed", "explorer.max_timeout"),
    (DynamicTimeoutConfig, "ratio"): Rule("timeouts are fixed", "explorer.max_timeout"),
    (SynchronizerConfig, "wait_for_checkpoint"): Rule(
        "the synchronizer's sync plan decides when weights move"
    ),
    (TrainerConfig, "trainer_type"): Rule("the trainer is always this project's FSDP2 trainer"),
    (TrainerConfig, "trainer_strategy"): Rule("the trainer always shards with FSDP2"),
    (TrainerConfig, "enable_preview"): Rule("no preview is made"),
    (TrainerConfig, "save_strategy"): Rule("every rank saves its own shard; rank 0 writes the HF export"),
    (MonitorConfig, "detailed_stats"): Rule("the same metrics are always logged"),
    (LoRAConfig, "base_model_name"): Rule(
        "the explorer receives the merged weights, so no base model is served beside the adapter"
    ),
}

# veRL keys under trainer.trainer_config that services/trainer/settings.py reads.
TRAINER_CONFIG_KEYS = frozenset(
    {
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "critic.optim.lr",
        "critic.optim.lr_warmup_steps",
        "critic.optim.lr_warmup_steps_ratio",
        "critic.optim.min_lr_ratio",
        "critic.optim.lr_scheduler_type",
        "critic.optim.weight_decay",
        "critic.cliprange_value",
        "critic.grad_clip",
        "algorithm.kl_ctrl.type",
        "algorithm.kl_ctrl.kl_coef",
        "algorithm.kl_ctrl.target_kl",
        "algorithm.kl_ctrl.horizon",
        "seed",
    }
)

# veRL keys that have a first-class key here: set that one (a copy here would be silently ignored).
TRAINER_CONFIG_MOVED = {
    "actor_rollout_ref.actor.optim.lr": "algorithm.optimizer.lr",
    "actor_rollout_ref.actor.optim.weight_decay": "algorithm.optimizer.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "algorithm.optimizer.lr_warmup_steps",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "algorithm.optimizer.lr_warmup_steps_ratio",
    "actor_rollout_ref.actor.ppo_epochs": "algorithm.ppo_epochs",
    "actor_rollout_ref.actor.grad_clip": "trainer.grad_clip",
    "actor_rollout_ref.actor.clip_ratio": "algorithm.policy_loss_fn_args.clip_range",
    "actor_rollout_ref.actor.entropy_coeff": "algorithm.entropy_loss_fn_args.entropy_coef",
    "actor_rollout_ref.actor.kl_loss_coef": "algorithm.kl_loss_fn_args.kl_coef",
    "actor_rollout_ref.actor.kl_loss_type": "algorithm.kl_loss_fn",
    "actor_rollout_ref.actor.loss_agg_mode": "algorithm.loss_agg_mode",
    "actor_rollout_ref.rollout.n": "algorithm.repeat_times",
    "actor_rollout_ref.rollout.temperature": "model.temperature",
    "actor_rollout_ref.model.path": "model.model_path",
    "algorithm.adv_estimator": "algorithm.advantage_fn",
    "data.max_prompt_length": "model.max_prompt_tokens",
    "data.max_response_length": "model.max_response_tokens",
    "data.train_batch_size": "buffer.batch_size",
    "trainer.total_epochs": "buffer.total_epochs",
    "trainer.total_training_steps": "buffer.total_steps",
}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{'a': {'b': 1}}` -> `{'a.b': 1}`."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten(value, name + ".")
        else:
            out[name] = value
    return out


def _rule(table: Mapping[tuple[type[BaseModel], str], Rule], cls: type, name: str) -> Rule | None:
    for klass in cls.__mro__:
        rule = table.get((klass, name))
        if rule is not None:
            return rule
    return None


def _applies(rule: Rule, section: BaseModel, name: str, value: Any) -> bool:
    if rule.applies is not None:
        return rule.applies(section, value)
    return value != type(section).model_fields[name].default


def _sections(node: Any, loc: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], BaseModel]]:
    """Every section instance under `node` with its location."""
    if isinstance(node, BaseModel):
        yield loc, node
        for name in type(node).model_fields:
            yield from _sections(getattr(node, name), (*loc, name))
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from _sections(item, (*loc, i))
    elif isinstance(node, Mapping):
        for key, item in node.items():
            if isinstance(item, BaseModel):
                yield from _sections(item, (*loc, str(key)))


def _matches(table: Mapping[tuple[type[BaseModel], str], Rule], config: RFTConfig):
    for loc, section in _sections(config, ()):
        for name in type(section).model_fields:
            rule = _rule(table, type(section), name)
            value = getattr(section, name)
            if rule is not None and _applies(rule, section, name, value):
                yield format_path((*loc, name)), value, rule


def refusals(config: RFTConfig, prefix: str = "") -> list[Problem]:
    """Keys set to a value this project cannot honour: path, why, and what to use instead."""
    pre = prefix + "." if prefix else ""
    problems = []
    for path, value, rule in _matches(REFUSED, config):
        msg = f"{value!r} is not supported: {rule.reason}"
        problems.append(Problem(pre + path, msg + (f"; use {rule.instead}" if rule.instead else "")))
    for key in flatten(config.trainer.trainer_config):
        if key in TRAINER_CONFIG_MOVED:
            problems.append(
                Problem(
                    f"{pre}trainer.trainer_config.{key}",
                    f"this veRL key is not read here; set {TRAINER_CONFIG_MOVED[key]} instead",
                )
            )
    return problems


def warnings(config: RFTConfig, prefix: str = "") -> list[str]:
    """One line per key that loads but has no effect here."""
    pre = prefix + "." if prefix else ""
    lines = []
    for path, value, rule in _matches(WARNED, config):
        tail = f"; use {rule.instead}" if rule.instead else ""
        lines.append(f"{pre}{path}: {value!r} has no effect here: {rule.reason}{tail}")
    for key in flatten(config.trainer.trainer_config):
        if key not in TRAINER_CONFIG_KEYS and key not in TRAINER_CONFIG_MOVED:
            lines.append(
                f"{pre}trainer.trainer_config.{key}: not read by this trainer (veRL key kept for reference); "
                "it has no effect"
            )
    return lines
