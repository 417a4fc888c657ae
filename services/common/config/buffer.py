"""`buffer` section: tasksets the explorer reads and the experience buffer the trainer reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from services.common.config.base import Section


class FormatConfig(Section):
    """How a taskset row maps to a prompt (Trinity-RFT `format`)."""

    prompt_type: Literal["messages", "plaintext", "chatpair"] = "messages"
    prompt_key: str = "prompt"
    response_key: str = "response"
    system_prompt_key: str | None = None
    system_prompt: str | None = None
    messages_key: str = "message"
    tools_key: str = "tools"
    image_key: str | None = None
    video_key: str | None = None
    reply_prefix: str | None = None
    workflow_key: str | None = None
    reward_fn_key: str | None = None
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    enable_concatenated_multi_turn: bool = False
    chat_template: str | None = None
    enable_thinking: bool | None = None


class RolloutArgs(Section):
    """Per-taskset sampling arguments; unset ones inherit `model.*`."""

    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    logprobs: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, gt=0)
    stop: list[str] | None = None


class DataSelectorConfig(Section):
    selector_type: Literal["sequential", "shuffle", "random"] = "sequential"
    seed: int = 42
    feature_keys: list[str] = []
    kwargs: dict[str, Any] = {}


class TasksetConfig(Section):
    """One taskset: a jsonl/json/parquet file or a `datasets` folder, with its format and rollout args."""

    name: str = ""
    storage_type: Literal["file"] = "file"
    path: str = ""
    split: str = "train"
    subset_name: str | None = None
    format: FormatConfig = FormatConfig()
    rollout_args: RolloutArgs = RolloutArgs()
    workflow_args: dict[str, Any] = {}
    reward_fn_args: dict[str, Any] = {}
    default_workflow_type: str | None = None
    default_reward_fn_type: str | None = None
    data_selector: DataSelectorConfig = DataSelectorConfig()
    repeat_times: int | None = Field(None, ge=1)
    max_retry_times: int = Field(3, ge=0)
    max_retry_interval: float = Field(1.0, ge=0)
    enable_progress_bar: bool = False
    # What to do with a row that lacks a key the format needs: skip it (reported) or stop.
    on_bad_row: Literal["skip", "error"] = "skip"


class ExplorerInputConfig(Section):
    taskset: TasksetConfig | None = None
    tasksets: list[TasksetConfig] = []
    eval_tasksets: list[TasksetConfig] = []
    default_workflow_type: str | None = None
    default_eval_workflow_type: str | None = None
    default_reward_fn_type: str | None = None


class ReplayBufferConfig(Section):
    """Priority reuse of experiences (Trinity-RFT `replay_buffer`)."""

    enable: bool = False
    priority_fn: Literal["linear_decay", "decay_limit_randomization"] = "linear_decay"
    reuse_cooldown_time: float | None = Field(None, ge=0)
    priority_fn_args: dict[str, Any] = {"decay": 2.0}
    use_count_limit: int = Field(3, ge=1)


class ExperienceBufferConfig(Section):
    name: str = "experience_buffer"
    storage_type: Literal["queue"] = "queue"
    path: str | None = None
    capacity: int = Field(10000, ge=1)
    max_read_timeout: float = Field(1800, gt=0)
    replay_buffer: ReplayBufferConfig = ReplayBufferConfig()
    max_retry_times: int = Field(3, ge=0)
    split: str = "train"
    format: FormatConfig = FormatConfig()
    data_selector: DataSelectorConfig = DataSelectorConfig()


class TrainerInputConfig(Section):
    experience_buffer: ExperienceBufferConfig = ExperienceBufferConfig()
    auxiliary_buffers: dict[str, ExperienceBufferConfig] = {}


class BufferConfig(Section):
    """Batch sizes and data. `batch_size` is tasks per explore step; `train_batch_size` 0 = batch x repeat."""

    batch_size: int = Field(1, ge=1)
    train_batch_size: int = Field(0, ge=0)
    total_epochs: int = Field(1, ge=1)
    total_steps: int | None = Field(None, ge=1)
    explorer_input: ExplorerInputConfig = ExplorerInputConfig()
    trainer_input: TrainerInputConfig = TrainerInputConfig()

    @model_validator(mode="after")
    def _one_taskset_form(self) -> BufferConfig:
        if self.explorer_input.taskset is not None and self.explorer_input.tasksets:
            raise ValueError("set either explorer_input.taskset or explorer_input.tasksets, not both")
        return self
