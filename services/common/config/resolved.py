"""Values derived from the config (batch sizes, token budgets, GPU split, run folders), computed on
demand and never written back into the tree."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from services.common.config.buffer import TasksetConfig
from services.common.config.gpus import GpuPlacement, gpu_demand, place_gpus
from services.common.config.root import RFTConfig


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

    @property
    def max_model_len(self) -> int | None:
        m = self.config.model
        if m.max_model_len:
            return m.max_model_len
        if m.max_prompt_tokens and m.max_response_tokens:
            return m.max_prompt_tokens + m.max_response_tokens
        return None

    @property
    def max_token_len_per_gpu(self) -> int | None:
        """Token budget of a dynamic micro-batch: set, else 2 x max_model_len (as Trinity-RFT)."""
        t = self.config.trainer
        if t.max_token_len_per_gpu:
            return t.max_token_len_per_gpu
        mml = self.max_model_len
        return 2 * mml // t.ulysses_sequence_parallel_size if mml else None

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
        --explorers N` places N; services/launch/gpus.py)."""
        c = self.config
        return place_gpus(c.cluster.node_num * c.cluster.gpu_per_node, gpu_demand(c), mode=c.mode)

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

    def rollout_args(self, taskset: TasksetConfig) -> dict[str, Any]:
        """Sampling args of a taskset: its own `rollout_args`, falling back to `model.*`."""
        m, r = self.config.model, taskset.rollout_args
        pick = lambda own, default: default if own is None else own  # noqa: E731
        return {
            "temperature": pick(r.temperature, m.temperature),
            "top_p": pick(r.top_p, m.top_p),
            "top_k": pick(r.top_k, m.top_k),
            "logprobs": pick(r.logprobs, m.logprobs),
            "max_tokens": pick(r.max_tokens, m.max_response_tokens),
            "stop": r.stop,
        }

    def repeat_times(self, taskset: TasksetConfig, eval: bool = False) -> int:
        if eval and taskset.repeat_times is not None:
            return taskset.repeat_times
        return self.config.algorithm.repeat_times if not eval else (taskset.repeat_times or 1)


def resolve(config: RFTConfig) -> Resolved:
    return Resolved(config)
