"""`algorithm` section: algorithm preset, group size, optimizer and the `*_fn` / `*_args` registry names."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from services.common.config.base import Section

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

    @field_validator("sample_strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        allowed = ("default", "staleness_control", "mix")
        if value not in allowed and ":" not in value:
            raise ValueError(
                f"{value!r} is not one of {', '.join(map(repr, allowed))} or a `module:object` plug-in"
            )
        return value
