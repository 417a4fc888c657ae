"""PPO clipped surrogate loss with clip-higher (DAPO) and dual clip.

The default policy loss (``vanilla``, alias ``ppo``) and the veRL-compatible
``compute_policy_loss`` that returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``.
Papers: PPO https://arxiv.org/abs/1707.06347, dual clip https://arxiv.org/abs/1912.09729,
clip-higher (DAPO) https://arxiv.org/abs/2503.14476.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from .aggregation import agg_loss
from .masked import masked_mean
from .params import FrozenParams
from .policy_loss_common import register_policy_loss, weighted

__all__ = ["PPOClipConfig", "compute_policy_loss", "compute_policy_loss_vanilla", "ppo_clip_losses"]

_RANGE_ALIASES = {
    "clip_range": "clip_ratio",
    "clip_range_low": "clip_ratio_low",
    "clip_range_high": "clip_ratio_high",
}


@dataclass(frozen=True)
class PPOClipConfig(FrozenParams):
    """PPO clip parameters (veRL ``actor`` names; Trinity's ``clip_range*`` accepted by ``from_dict``).

    ``clip_ratio_low``/``clip_ratio_high`` fall back to ``clip_ratio`` (0.2); DAPO uses 0.2/0.28.
    ``clip_ratio_c`` (3.0) is the dual-clip bound for negative advantages and must be > 1.
    """

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0

    _aliases: ClassVar[Mapping[str, str]] = _RANGE_ALIASES

    def __post_init__(self) -> None:
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {self.clip_ratio_c}")
        if min(self.low, self.high) < 0:
            raise ValueError(f"clip ratios must be >= 0, got low={self.low}, high={self.high}")

    @property
    def low(self) -> float:
        """Effective ε_low."""
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def high(self) -> float:
        """Effective ε_high."""
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


def ppo_clip_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss and its three metrics (before aggregation).

    ρ = clamp(log π − log π_old, ±20), r = exp(ρ);  L1 = −A·r;  L2 = −A·clip(r, 1−ε_low, 1+ε_high);
    Lc = max(L1, L2);  L3 = −A·c;  loss = min(Lc, L3) where A < 0, else Lc.
    pg_clipfrac = mean_m[L2 > L1];  ppo_kl = mean_m(−ρ);  pg_clipfrac_lower = mean_m[Lc > L3 ∧ A < 0].
    Shapes: inputs ``(bs, response_length)``; returns (loss matrix, clipfrac, ppo_kl, clipfrac_lower).
    """
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl.detach(), response_mask)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped1 = torch.maximum(losses1, losses2)
    pg_clipfrac = masked_mean(torch.gt(losses2, losses1).float(), response_mask)
    losses3 = -advantages * clip_ratio_c
    clipped2 = torch.minimum(losses3, clipped1)
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean((torch.gt(clipped1, losses3) & negative).float(), response_mask)
    pg_losses = torch.where(negative, clipped2, clipped1)
    return pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """veRL's (legacy) PPO loss API: returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``.

    The formula is that of ``ppo_clip_losses`` aggregated with ``agg_loss``; ``cliprange_low``/
    ``cliprange_high`` fall back to ``cliprange``, one of which must be given.
    Shapes: inputs ``(bs, response_length)``; outputs are scalars.
    """
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError("compute_policy_loss needs cliprange (or both cliprange_low and cliprange_high)")
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}")
    pg_losses, clipfrac, ppo_kl, clipfrac_lower = ppo_clip_losses(
        old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c
    )
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, clipfrac, ppo_kl, clipfrac_lower


@register_policy_loss("vanilla", "ppo", config_cls=PPOClipConfig)
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: PPOClipConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clip + clip-higher + dual clip (see ``ppo_clip_losses`` for the formula).

    Defaults: ε = 0.2, c = 3.0.  Metrics: ``actor/pg_clipfrac``, ``actor/ppo_kl``,
    ``actor/pg_clipfrac_lower``.  Shapes: inputs ``(bs, response_length)``; loss is a scalar.
    """
    assert config is not None  # filled by register_policy_loss
    pg_losses, clipfrac, ppo_kl, clipfrac_lower = ppo_clip_losses(
        old_log_prob, log_prob, advantages, response_mask, config.low, config.high, config.clip_ratio_c
    )
    loss = agg_loss(weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    return loss, {
        "actor/pg_clipfrac": float(clipfrac),
        "actor/ppo_kl": float(ppo_kl),
        "actor/pg_clipfrac_lower": float(clipfrac_lower),
    }
