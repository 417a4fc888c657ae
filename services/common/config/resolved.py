"""Values derived from the config (batch sizes, token budgets, GPU split, run folders, what a shared
GPU changes: the weight-sync group's backend and the rollout engine's memory share), computed on
demand and never written back into the tree."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from services.common.config.buffer import RolloutArgs, TasksetConfig
from services.common.config.errors import Problem
from services.common.config.explorer import InferenceModelConfig
from services.common.config.gpus import (
    SHARED_GPU_MARGIN,
    GpuPlacement,
    gpu_demand,
    place_gpus,
    weight_sync_backend,
)
from services.common.config.root import RFTConfig
from services.common.config.sync_plan import SyncPlan
from services.common.sampling import SamplingParams

# Share of the GPU the rollout engine takes, when not set, on a GPU it shares with the trainer
# (one-GPU mode): the rest is the trainer's (launcher/memory_plan.py checks that it fits).
SHARED_GPU_ROLLOUT_MEMORY = 0.3
# ... and on GPUs it time-shares with the trainer (`cluster.colocate`): veRL's default
# `actor_rollout_ref.rollout.gpu_memory_utilization` for its hybrid engine; the trainer's resident state
# (weights, and optimizer state unless offloaded) keeps the rest while the engine is awake.
COLOCATED_ROLLOUT_MEMORY = 0.5


@dataclass(frozen=True)
class Resolved:
    """A read-only view of `RFTConfig` with the derived values every service agrees on."""

    config: RFTConfig

    @property
    def train_batch_size(self) -> int:
        """Experiences per trainer step: buffer.train_batch_size, or batch_size x repeat_times when 0."""
        b = self.config.buffer
        return b.train_batch_size or b.batch_size * self.config.algorithm.repeat_times

    @property
    def experiences_per_explore_step(self) -> int:
        return self.config.buffer.batch_size * self.config.algorithm.repeat_times

    @property
    def tasksets(self) -> list[TasksetConfig]:
        """Training tasksets (`taskset` and `tasksets` folded into one list)."""
        ei = self.config.buffer.explorer_input
        return [ei.taskset] if ei.taskset is not None else list(ei.tasksets)

    def _twin(self, name: str, model_name: str | None = None) -> Any:
        """`model.<name>`, else its twin `explorer.rollout_model.<name>` (`twin_problems` refuses two
        different values at load)."""
        own = getattr(self.config.model, model_name or name)
        return own if own is not None else getattr(self.config.explorer.rollout_model, name)

    @property
    def max_prompt_tokens(self) -> int | None:
        return self._twin("max_prompt_tokens")

    @property
    def max_model_len(self) -> int | None:
        """Prompt + response tokens: set, else max_prompt_tokens + max_response_tokens when both are set."""
        mml = self._twin("max_model_len")
        if mml:
            return mml
        p, r = self.max_prompt_tokens, self._twin("max_response_tokens")
        return p + r if p and r else None

    @property
    def max_response_tokens(self) -> int | None:
        """Tokens a rollout may generate: set, else max_model_len - max_prompt_tokens; None when
        neither gives a number (`token_limit_problems` then refuses a run that samples)."""
        r = self._twin("max_response_tokens")
        if r:
            return r
        mml, p = self._twin("max_model_len"), self.max_prompt_tokens
        return mml - p if mml and p and mml > p else None

    @property
    def enable_thinking(self) -> bool | None:
        return self._twin("enable_thinking")

    @property
    def chat_template(self) -> str | None:
        """Jinja text: model.custom_chat_template, the file model.chat_template_path, or
        explorer.rollout_model.chat_template; None = the tokenizer's own."""
        m = self.config.model
        if m.custom_chat_template:
            return m.custom_chat_template
        if m.chat_template_path:
            return Path(m.chat_template_path).read_text()
        return self.config.explorer.rollout_model.chat_template

    @property
    def rollout_model(self) -> InferenceModelConfig:
        """`explorer.rollout_model` with its twins of `model.*` filled with the resolved values, and on
        a GPU shared with the trainer its memory share (`rollout_gpu_memory_utilization`) and, for
        vLLM, sleep mode, unless the config sets them."""
        rollout = self.config.explorer.rollout_model
        update: dict[str, Any] = {
            "max_model_len": self.max_model_len,
            "max_prompt_tokens": self.max_prompt_tokens,
            "max_response_tokens": self.max_response_tokens,
            "enable_thinking": self.enable_thinking,
        }
        if self.shared_gpu:
            update["gpu_memory_utilization"] = self.rollout_gpu_memory_utilization
        if self.shared_gpu or self.colocated:
            sleeps = rollout.engine_type == "vllm" or self.sync_plan.engines_sleep_after_step()
            if sleeps and "enable_sleep_mode" not in rollout.model_fields_set:
                update["enable_sleep_mode"] = True
        return rollout.model_copy(update=update)

    @property
    def colocated(self) -> bool:
        """`cluster.colocate`: the trainer and the engines time-share the same GPUs (gpus.py); the
        engines sleep while the trainer steps (`SyncPlan.colocated`), also with no GPU placed (CPU)."""
        return self.sync_plan.colocated

    @property
    def shared_gpu(self) -> bool:
        """The trainer and the explorer share one GPU (one-GPU mode, gpus.py)."""
        return self.gpu_placement.shared

    @property
    def rollout_gpu_memory_utilization(self) -> float | None:
        """The rollout engine's share of its GPU: `explorer.rollout_model.gpu_memory_utilization` when
        set; else SHARED_GPU_ROLLOUT_MEMORY on a shared GPU; else vLLM's default and, for hf, None (no
        cap, as without a placement). The hf engine caps its CUDA allocator at it (hf.py)."""
        r = self.config.explorer.rollout_model
        if "gpu_memory_utilization" in r.model_fields_set:
            return r.gpu_memory_utilization
        if self.colocated and self.shared_gpu:
            return COLOCATED_ROLLOUT_MEMORY
        if self.shared_gpu:
            return SHARED_GPU_ROLLOUT_MEMORY
        return r.gpu_memory_utilization if r.engine_type == "vllm" else None

    @property
    def trainer_gpu_memory_fraction(self) -> float | None:
        """The trainer's cap on a GPU it shares with the rollout engine: 1 - the engine's share
        (`rollout_gpu_memory_utilization`) - SHARED_GPU_MARGIN; None (no cap) on a GPU of its own."""
        share = self.rollout_gpu_memory_utilization
        if not self.shared_gpu or share is None:
            return None
        if self.colocated:  # the engine sleeps while the trainer steps: all but the margin
            return round(1.0 - SHARED_GPU_MARGIN, 6)
        return round(1.0 - share - SHARED_GPU_MARGIN, 6)

    @property
    def weight_sync_backend(self) -> str:
        """The nccl method's group backend, for the trainer and every explorer alike: gloo on a
        shared GPU, else `synchronizer.group_backend` (gpus.py `weight_sync_backend`)."""
        return weight_sync_backend(self.config.synchronizer.group_backend, self.shared_gpu)

    @property
    def max_token_len_per_gpu(self) -> int | None:
        """Token budget of a dynamic micro-batch: set, else 2 x max_model_len (as Trinity-RFT)."""
        t = self.config.trainer
        if t.max_token_len_per_gpu:
            return t.max_token_len_per_gpu
        mml = self.max_model_len
        return 2 * mml // t.ulysses_sequence_parallel_size if mml else None

    @property
    def total_steps(self) -> int | None:
        """The trainer's steps in the stage: `buffer.total_steps`, else `trainer.total_steps` (None:
        until the data ends). The one place this choice is made."""
        return self.config.buffer.total_steps or self.config.trainer.total_steps

    @cached_property
    def sync_plan(self) -> SyncPlan:
        """The typed sync policy of `synchronizer.sync_style` (services/common/config/sync_plan.py)."""
        return SyncPlan.from_config(self.config)

    @property
    def max_staleness(self) -> int | None:
        """Most trainer steps an experience's model_version may lag the trainer's (older ones are
        dropped by the buffer): `SyncPlan.default_staleness()` (`sample_strategy_args.max_staleness`
        with `staleness_control`; fully_async's default; else None, no bound)."""
        return self.sync_plan.default_staleness()

    @property
    def mini_batch_size(self) -> int:
        """Experiences per optimizer step (veRL ppo_mini_batch_size x rollout.n)."""
        return self.train_batch_size

    @cached_property
    def gpu_split(self) -> dict[str, int]:
        """GPU counts of the cluster (node_num x gpu_per_node): one explorer's rollout engines and
        auxiliary models, the trainer the rest (Trinity-RFT's rule; see gpus.py)."""
        c = self.config
        total = c.cluster.node_num * c.cluster.gpu_per_node
        demand = gpu_demand(c)
        return {
            "total": total,
            "rollout": demand.rollout,
            "auxiliary": demand.auxiliary,
            "trainer": max(total - demand.explorer, 0),
        }

    @cached_property
    def gpu_placement(self) -> GpuPlacement:
        """Which GPUs (0..total-1) the explorer and the trainer get with one explorer (`rft run
        --explorers N` places N; launcher/gpus.py)."""
        c = self.config
        return place_gpus(
            c.cluster.node_num * c.cluster.gpu_per_node,
            gpu_demand(c),
            mode=c.mode,
            colocate=c.cluster.colocate,
        )

    @property
    def job_dir(self) -> Path:
        c = self.config
        parts = [c.checkpoint_root_dir, c.project] + ([c.group] if c.group else []) + [c.name]
        return Path(*parts)

    @property
    def explorer_run_name(self) -> str:
        return f"{self.config.name}_explorer"

    @property
    def trainer_run_name(self) -> str:
        return f"{self.config.name}_trainer"

    @property
    def critic_model_path(self) -> str:
        m = self.config.model
        return m.critic_model_path or m.model_path

    def temperature(self, taskset: TasksetConfig | None = None) -> float:
        """The taskset's `rollout_args.temperature`, else `model.temperature`."""
        own = taskset.rollout_args.temperature if taskset is not None else None
        return self.config.model.temperature if own is None else own

    def response_limit(self, taskset: TasksetConfig | None = None) -> int | None:
        """The taskset's `rollout_args.max_tokens`, else `max_response_tokens` (None: no limit known)."""
        own = taskset.rollout_args.max_tokens if taskset is not None else None
        return self.max_response_tokens if own is None else own

    def sampling_params(self, taskset: TasksetConfig | None = None, **overrides: Any) -> SamplingParams:
        """The one mapping from config to sampling arguments: the taskset's `rollout_args`, falling back
        to `model.*` (no taskset: `model.*` only); `overrides` replace fields (validated by name)."""
        m = self.config.model
        r = taskset.rollout_args if taskset is not None else RolloutArgs()
        pick = lambda own, default: default if own is None else own  # noqa: E731
        limit = overrides.pop("max_tokens") if "max_tokens" in overrides else self.response_limit(taskset)
        base = SamplingParams(
            temperature=self.temperature(taskset),
            top_p=pick(r.top_p, m.top_p),
            top_k=pick(r.top_k, m.top_k),
            logprobs=pick(r.logprobs, m.logprobs),
            max_tokens=limit,
            min_tokens=m.min_response_tokens,
            repetition_penalty=m.repetition_penalty,
            ignore_eos=self.config.explorer.rollout_model.ignore_eos,
            stop=tuple(r.stop or ()),
        )
        return base.replace(**overrides)

    def repeat_times(self, taskset: TasksetConfig, eval: bool = False) -> int:
        if eval and taskset.repeat_times is not None:
            return taskset.repeat_times
        return self.config.algorithm.repeat_times if not eval else (taskset.repeat_times or 1)


# `explorer.rollout_model.<key>` twins of `model.<key>` (Trinity-RFT has both); one value is used.
TWINS = {
    "max_model_len": "max_model_len",
    "max_prompt_tokens": "max_prompt_tokens",
    "max_response_tokens": "max_response_tokens",
    "enable_thinking": "enable_thinking",
    "chat_template": "custom_chat_template",
}


def twin_problems(config: RFTConfig) -> list[Problem]:
    """`explorer.rollout_model.X` and `model.X` both set to different values."""
    problems = []
    for rollout_key, model_key in TWINS.items():
        a, b = getattr(config.model, model_key), getattr(config.explorer.rollout_model, rollout_key)
        if a is not None and b is not None and a != b:
            problems.append(
                Problem(
                    f"explorer.rollout_model.{rollout_key}",
                    f"{b!r} differs from model.{model_key} ({a!r}); set one of the two (model.{model_key})",
                )
            )
    return problems


def token_limit_problems(config: RFTConfig) -> list[Problem]:
    """A run that samples needs a response-token limit for every taskset: its rollout_args.max_tokens,
    model.max_response_tokens, or max_model_len - max_prompt_tokens. There is no hidden default."""
    if config.mode == "train":
        return []
    res = resolve(config)
    if res.max_response_tokens is not None:
        return []
    ei = config.buffer.explorer_input
    named = [("buffer.explorer_input.taskset", ei.taskset)] if ei.taskset is not None else []
    named += [(f"buffer.explorer_input.tasksets[{i}]", t) for i, t in enumerate(ei.tasksets)]
    named += [(f"buffer.explorer_input.eval_tasksets[{i}]", t) for i, t in enumerate(ei.eval_tasksets)]
    return [
        Problem(
            "model.max_response_tokens",
            f"not set and no limit can be derived, but {path} samples with no rollout_args.max_tokens; "
            "set model.max_response_tokens (e.g. 512), or model.max_model_len and model.max_prompt_tokens",
        )
        for path, t in named
        if t.rollout_args.max_tokens is None
    ][:1]


def resolve(config: RFTConfig) -> Resolved:
    return Resolved(config)
