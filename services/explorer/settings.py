"""`ExplorerSettings`: what the explorer core and its parts read from the run config, in one frozen
record built once in the service entry (`services.explorer.service.build_core`).

Plain values are copied out of their sections (and the resolved view: job folder, token limits, chat
template); where a part needs a whole typed section it gets that section itself (`filter_groups` for
dynamic sampling, the taskset configs). The taskset factories keep the `Resolved` view
(`resolved`): it is the one mapping from the config to sampling params and repeat counts
(services/common/config/resolved.py), shared with the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.common.config import Resolved, RFTConfig, TasksetConfig, resolve
from services.common.config.algorithm import FilterGroupsConfig
from services.common.config.sync_plan import SyncPlan
from services.weight_sync.method import SyncMethod, sync_method

__all__ = ["ExplorerSettings"]


@dataclass(frozen=True)
class ExplorerSettings:
    mode: str  # both | explore | bench | serve
    job_dir: Path
    # the run's length and the step's size
    total_steps: int | None  # buffer.total_steps (None: until the data ends)
    batch_size: int  # buffer.batch_size: tasks per explore step (all explorers together)
    split_batch: bool  # explorer.split_batch: each of n explorers takes batch_size / n
    continue_from_checkpoint: bool
    # the tasksets (train: `taskset` and `tasksets` folded into one list)
    tasksets: tuple[TasksetConfig, ...]
    eval_tasksets: tuple[TasksetConfig, ...]
    eval_interval: int
    eval_on_startup: bool
    bench_on_latest_checkpoint: bool
    # running workflows
    runner_per_model: int
    max_timeout: float
    max_retry_times: int
    filter_groups: FilterGroupsConfig  # algorithm.filter_groups (DAPO dynamic sampling)
    # prompts (model.* with their explorer.rollout_model twins resolved)
    max_prompt_tokens: int | None
    enable_prompt_truncation: bool
    chat_template: str | None  # Jinja text; None: the tokenizer's own
    enable_thinking: bool | None
    tool_call_parser: str | None
    # weights
    weight_digest: bool  # synchronizer.weight_digest: log a SHA-256 of every weight load
    sync_timeout: float  # synchronizer.sync_timeout
    # the taskset factories' sampling and repeat rules (scheduler.open_tasksets)
    resolved: Resolved = field(repr=False)
    # synchronizer.sync_method, resolved once from its name (services/weight_sync/method.py)
    sync_method: SyncMethod = field(default_factory=lambda: sync_method("nccl"))
    # synchronizer.sync_style/interval/offset (services/common/config/sync_plan.py)
    sync_plan: SyncPlan = SyncPlan()
    # synchronizer.fanout as the method uses it (`SyncMethod.tree_fanout`): > 0, this explorer serves
    # a weight relay in a tree of that fan-out; 0, it pulls from the synchronizer (star)
    relay_fanout: int = 0

    @classmethod
    def from_config(cls, config: RFTConfig) -> ExplorerSettings:
        res = resolve(config)
        ex = config.explorer
        method = sync_method(config.synchronizer.sync_method, config.synchronizer.wire_dtype)
        return cls(
            mode=config.mode,
            job_dir=res.job_dir,
            total_steps=config.buffer.total_steps,
            batch_size=config.buffer.batch_size,
            split_batch=ex.split_batch,
            continue_from_checkpoint=config.continue_from_checkpoint,
            tasksets=tuple(res.tasksets),
            eval_tasksets=tuple(config.buffer.explorer_input.eval_tasksets),
            eval_interval=ex.eval_interval,
            eval_on_startup=ex.eval_on_startup,
            bench_on_latest_checkpoint=ex.bench_on_latest_checkpoint,
            runner_per_model=ex.runner_per_model,
            max_timeout=ex.max_timeout,
            max_retry_times=ex.max_retry_times,
            filter_groups=config.algorithm.filter_groups,
            max_prompt_tokens=res.max_prompt_tokens,
            enable_prompt_truncation=config.model.enable_prompt_truncation,
            chat_template=res.chat_template,
            enable_thinking=res.enable_thinking,
            tool_call_parser=ex.rollout_model.tool_call_parser,
            weight_digest=config.synchronizer.weight_digest,
            sync_timeout=config.synchronizer.sync_timeout,
            resolved=res,
            sync_method=method,
            sync_plan=res.sync_plan,
            relay_fanout=method.tree_fanout(config.synchronizer.fanout),
        )
