"""Rollout importance-sampling correction: reweight or reject tokens the rollout engine sampled
under a slightly different policy than the trainer's (veRL ``rollout_is``, truncated IS / TIS).

The rollout engine (vLLM in bf16, or a one-step-stale policy) samples from π_rollout; the trainer's
"old" policy π_old is its own recomputation.  With ρ_t = π_old(y_t) / π_rollout(y_t) per token the
policy gradient is corrected by a weight w that multiplies the per-token policy loss
(AReaL's decoupled PPO behaviour weight; Liu, Li et al. 2025, "When Speed Kills Stability",
https://richardli.xyz/rl-collapse; TIS: https://fengyao.notion.site/off-policy-rl):

- level (``rollout_is_level``): ``token`` w_t = ρ_t;  ``sequence`` w = Π_t ρ_t;
  ``geometric`` w = (Π_t ρ_t)^(1/T), all computed in log space with log w clamped to ±20.
- mode (``rollout_is_mode``): ``truncate`` w ← min(w, upper) (TIS);  ``mask`` keeps w but drops
  tokens with w outside [lower, upper] from the response mask (rejection sampling).
  ``lower`` defaults to 1/upper.
- veto (``rollout_is_veto_threshold``): a sequence holding any token with ρ_t < veto is dropped.

Rejection changes the response mask (so the loss normaliser excludes rejected tokens), never the
weights.  Levels and modes are registries, so the step code never branches on them.  Metric names
are veRL's (``mismatch/rollout_is_mean``, …).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from services.common.registry import Registry

from .batch import TrainBatch
from .masked import masked_mean, masked_sum
from .params import FrozenParams

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_IS_MODES",
    "RolloutISConfig",
    "apply_rollout_correction",
    "compute_rollout_importance_weights",
]

SAFETY_BOUND = 20.0
LevelFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ModeFn = Callable[[torch.Tensor, torch.Tensor, float, float], tuple[torch.Tensor, torch.Tensor]]
ROLLOUT_IS_LEVELS: Registry[LevelFn] = Registry("rollout_is_level")
ROLLOUT_IS_MODES: Registry[ModeFn] = Registry("rollout_is_mode")


@ROLLOUT_IS_LEVELS.register("token")
def _token_log_weights(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log w_t = log ρ_t."""
    return log_ratio


@ROLLOUT_IS_LEVELS.register("sequence")
def _sequence_log_weights(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log w = Σ_t m_t log ρ_t, broadcast over the sequence."""
    return masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)


@ROLLOUT_IS_LEVELS.register("geometric")
def _geometric_log_weights(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log w = mean_t log ρ_t over the masked tokens, broadcast over the sequence."""
    return masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)


@ROLLOUT_IS_MODES.register("truncate")
def _truncate(weights: torch.Tensor, mask: torch.Tensor, lower: float, upper: float):
    """TIS: w ← min(w, upper); the mask is unchanged."""
    return weights.clamp(max=upper), mask


@ROLLOUT_IS_MODES.register("mask")
def _reject(weights: torch.Tensor, mask: torch.Tensor, lower: float, upper: float):
    """Rejection: tokens with w outside [lower, upper] leave the mask; w is unchanged."""
    keep = (weights >= lower) & (weights <= upper)
    return weights, mask * keep.to(mask.dtype)


@dataclasses.dataclass(frozen=True)
class RolloutISConfig(FrozenParams):
    """veRL's ``algorithm.rollout_is*`` keys.  ``rollout_is_threshold`` None = off (no metrics);
    ``rollout_is`` False = metrics only, True = weights applied to the policy loss."""

    rollout_is: bool = False
    rollout_is_threshold: float | None = None
    rollout_is_threshold_lower: float | None = None
    rollout_is_level: str = "token"
    rollout_is_mode: str = "truncate"
    rollout_is_veto_threshold: float | None = None

    def __post_init__(self) -> None:
        ROLLOUT_IS_LEVELS.get(self.rollout_is_level)
        ROLLOUT_IS_MODES.get(self.rollout_is_mode)
        for name in ("rollout_is_threshold", "rollout_is_threshold_lower", "rollout_is_veto_threshold"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"algorithm.{name} must be > 0, got {value}")
        if self.rollout_is and self.rollout_is_threshold is None:
            raise ValueError(
                "algorithm.rollout_is: true needs algorithm.rollout_is_threshold (e.g. 2.0) to be set"
            )
        if self.enabled and self.lower > self.rollout_is_threshold:  # type: ignore[operator]
            raise ValueError(
                f"algorithm.rollout_is_threshold_lower ({self.lower}) must be <= "
                f"rollout_is_threshold ({self.rollout_is_threshold})"
            )

    @property
    def enabled(self) -> bool:
        """Whether weights and metrics are computed at all."""
        return self.rollout_is_threshold is not None

    @property
    def lower(self) -> float:
        """Lower threshold: given, else 1/upper."""
        if self.rollout_is_threshold_lower is not None:
            return self.rollout_is_threshold_lower
        return 1.0 / float(self.rollout_is_threshold or 1.0)


def compute_rollout_importance_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutISConfig,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """IS weights, the response mask after rejection, and ``mismatch/*`` metrics (module docstring).

    Shapes: inputs ``(bs, response_length)``; weights (0 at padding) and mask likewise.
    Metrics: ``rollout_is_{mean,std,min,max}`` of w before truncation over masked tokens,
    ``rollout_is_eff_sample_size`` = 1/mean((w/mean w)²) of the applied weights,
    ``rollout_is_ratio_fraction_{high,low}``, ``rollout_is_masked_fraction`` (tokens dropped by
    rejection or veto), ``rollout_is_veto_fraction`` (sequences vetoed), ``mismatch_kl`` =
    mean(log π_rollout − log π_old) and ``mismatch_k3_kl`` = mean(e^x − x − 1), x = log ρ.
    """
    mask = response_mask.to(old_log_prob.dtype)
    upper, lower = float(config.rollout_is_threshold), config.lower  # type: ignore[arg-type]
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    log_w = ROLLOUT_IS_LEVELS.get(config.rollout_is_level)(log_ratio, mask)
    raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    weights, kept = ROLLOUT_IS_MODES.get(config.rollout_is_mode)(raw, mask, lower, upper)
    seq_valid = mask.sum(-1) > 0
    vetoed = torch.zeros_like(seq_valid)
    if config.rollout_is_veto_threshold is not None:
        vetoed = ((log_ratio < math.log(config.rollout_is_veto_threshold)) & (mask > 0)).any(-1)
        kept = kept * (~vetoed).unsqueeze(-1).to(kept.dtype)
    weights = weights * mask
    valid = mask > 0
    w_raw = raw[valid] if valid.any() else raw.new_ones(1)
    normed = weights / masked_mean(weights, mask).clamp_min(1e-12)
    n_seq = max(int(seq_valid.sum()), 1)
    metrics = {
        "mismatch/rollout_is_mean": float(w_raw.mean()),
        "mismatch/rollout_is_std": float(w_raw.std(unbiased=False)),
        "mismatch/rollout_is_min": float(w_raw.min()),
        "mismatch/rollout_is_max": float(w_raw.max()),
        "mismatch/rollout_is_eff_sample_size": float(
            1.0 / masked_mean(normed.square(), mask).clamp_min(1e-12)
        ),
        "mismatch/rollout_is_ratio_fraction_high": float(masked_mean((raw > upper).float(), mask)),
        "mismatch/rollout_is_ratio_fraction_low": float(masked_mean((raw < lower).float(), mask)),
        "mismatch/rollout_is_masked_fraction": float(masked_mean(1.0 - kept, mask)),
        "mismatch/rollout_is_veto_fraction": float((vetoed & seq_valid).sum()) / n_seq,
        "mismatch/mismatch_kl": float(masked_mean(-log_ratio, mask)),
        "mismatch/mismatch_k3_kl": float(masked_mean(torch.expm1(log_ratio) - log_ratio, mask)),
    }
    return weights, kept, metrics


def apply_rollout_correction(
    batch: TrainBatch, config: RolloutISConfig
) -> tuple[TrainBatch, dict[str, float]]:
    """The batch with ``rollout_is_weights`` (when ``rollout_is``) and the rejection applied to its
    ``response_mask``, plus the metrics; unchanged with no metrics when the threshold is unset."""
    if not config.enabled:
        return batch, {}
    if batch.rollout_log_probs is None:
        raise ValueError(
            "algorithm.rollout_is_threshold is set but the experiences carry no rollout log-probs "
            "(Experience.logprobs); unset the threshold or use an engine/workflow that reports them"
        )
    weights, mask, metrics = compute_rollout_importance_weights(
        batch.require("old_log_probs"), batch.rollout_log_probs, batch.response_mask, config
    )
    if not config.rollout_is:  # metrics only
        return batch, metrics
    return batch.replace(
        rollout_is_weights=weights, response_mask=mask.to(batch.response_mask.dtype)
    ), metrics
