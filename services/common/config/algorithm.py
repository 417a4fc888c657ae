"""`algorithm` section: algorithm preset, group size, optimizer and the `*_fn` / `*_args` registry names."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.common.config.base import Section
from services.common.config.errors import close_match

ALGORITHM_TYPES = (
    "ppo",
    "grpo",
    "rloo",
    "reinforceplusplus",
    "remax",
    "opo",
    "gspo",
    "cispo",
    "sapo",
    "gpg",
    "dapo",
    "sft",
    "dpo",
)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class OptimizerConfig(Section):
    """Optimizer and learning-rate schedule (Trinity-RFT `algorithm.optimizer`)."""

    lr: float = Field(1e-6, gt=0)
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = Field(0.0, ge=0, le=1)
    min_lr_ratio: float = Field(0.01, ge=0, le=1)
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    optimizer_type: Literal["adam", "adamw"] = "adamw"
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.01, ge=0)
    clip_grad: float = Field(1.0, gt=0)
    eps: float = Field(1e-8, gt=0)


class FilterGroupsConfig(Section):
    """DAPO dynamic sampling (veRL `algorithm.filter_groups`): the explorer drops groups whose
    `metric` is equal for every sample and samples more tasks until the step's batch is full, at
    most `max_num_gen_batches` generation rounds per step (0 = no bound)."""

    enable: bool = False
    metric: Literal["acc", "score", "seq_reward", "seq_final_reward"] = "acc"
    max_num_gen_batches: int = Field(0, ge=0)


class AlgorithmConfig(Section):
    """Which RL algorithm runs. A `*_fn` left unset is filled by the `algorithm_type` preset."""

    algorithm_type: Literal[ALGORITHM_TYPES] = "ppo"  # type: ignore[valid-type]
    repeat_times: int = Field(1, ge=1)
    optimizer: OptimizerConfig = OptimizerConfig()
    sample_strategy: str = "default"
    sample_strategy_args: dict[str, Any] | None = None
    advantage_fn: str | None = None
    advantage_fn_args: dict[str, Any] | None = None
    kl_penalty_fn: str | None = None
    kl_penalty_fn_args: dict[str, Any] | None = None
    policy_loss_fn: str | None = None
    policy_loss_fn_args: dict[str, Any] | None = None
    kl_loss_fn: str | None = None
    kl_loss_fn_args: dict[str, Any] | None = None
    entropy_loss_fn: str | None = None
    entropy_loss_fn_args: dict[str, Any] | None = None
    loss_agg_mode: Literal[LOSS_AGG_MODES] | None = None  # type: ignore[valid-type]
    # PPO epochs over each train batch (veRL actor.ppo_epochs).
    ppo_epochs: int = Field(1, ge=1)
    # Reward shaping before advantages (veRL reward_model.reward_manager): naive | dapo (overlong
    # penalty: args {overlong_buffer: {enable, len, penalty_factor, log}, max_resp_len}); None = preset.
    reward_manager: str | None = None
    reward_manager_args: dict[str, Any] | None = None
    filter_groups: FilterGroupsConfig = FilterGroupsConfig()
    # Rollout importance-sampling correction (veRL algorithm.rollout_is*): a threshold turns on
    # the `mismatch/*` metrics; `rollout_is: true` also applies the weights to the policy loss.
    rollout_is: bool = False
    rollout_is_threshold: float | None = Field(None, gt=0)
    rollout_is_threshold_lower: float | None = Field(None, gt=0)
    rollout_is_level: Literal["token", "sequence", "geometric"] = "token"
    rollout_is_mode: Literal["truncate", "mask"] = "truncate"
    rollout_is_veto_threshold: float | None = Field(None, gt=0)

    @property
    def pairwise(self) -> bool:
        """Whether training reads (chosen, rejected) pairs (DPO): offline rows become pair experiences."""
        return (self.policy_loss_fn or self.algorithm_type) == "dpo"

    @model_validator(mode="after")
    def _rollout_is_thresholds(self) -> AlgorithmConfig:
        if self.rollout_is and self.rollout_is_threshold is None:
            raise ValueError("rollout_is: true needs rollout_is_threshold (e.g. 2.0); without it IS is off")
        lower, upper = self.rollout_is_threshold_lower, self.rollout_is_threshold
        if lower is not None and upper is not None and lower > upper:
            raise ValueError(
                f"rollout_is_threshold_lower ({lower}) must be <= rollout_is_threshold ({upper})"
            )
        return self

    @property
    def greedy_baseline(self) -> bool:
        """Whether each training task also needs a greedy rollout's reward (ReMax's baseline)."""
        return (self.advantage_fn or self.algorithm_type) == "remax"

    @field_validator("sample_strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        allowed = ("default", "staleness_control", "mix")
        if value not in allowed and ":" not in value:
            hint = close_match(value, allowed)
            raise ValueError(
                f"{value!r} is not one of {', '.join(map(repr, allowed))} or a `module:object` plug-in"
                + (f"; did you mean `{hint}`?" if hint else "")
            )
        return value
