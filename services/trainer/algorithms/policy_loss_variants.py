"""Policy losses that change PPO's ratio or clipping: GSPO, CISPO, SAPO and GPG.

All follow the shared signature of ``policy_loss_common``.  The stop-gradients matter: GSPO
detaches the sequence ratio and lets gradient through each token's log-prob; CISPO detaches the
clipped importance weight, so every token keeps a REINFORCE gradient however far its ratio is.
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
from .policy_loss_ppo import _RANGE_ALIASES

__all__ = [
    "CISPOConfig",
    "GPGConfig",
    "GSPOConfig",
    "SAPOConfig",
    "compute_policy_loss_cispo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_sapo",
]


def _metrics(clipfrac: float, neg_kl: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """The variants' metrics: the clipped fraction, the old-vs-new KL, no lower clip."""
    return {
        "actor/pg_clipfrac": clipfrac,
        "actor/ppo_kl": float(masked_mean(-neg_kl.detach(), response_mask)),
        "actor/pg_clipfrac_lower": 0.0,
    }


@dataclass(frozen=True)
class GSPOConfig(FrozenParams):
    """GSPO clip range on the sequence ratio; the paper uses ε_low = 3e-4, ε_high = 4e-4."""

    clip_ratio_low: float = 3e-4
    clip_ratio_high: float = 4e-4

    _aliases: ClassVar[Mapping[str, str]] = _RANGE_ALIASES


@register_policy_loss("gspo", config_cls=GSPOConfig)
def compute_policy_loss_gspo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
):
    """Group Sequence Policy Optimization, https://arxiv.org/abs/2507.18071.

    log s_i = Σ_t m·(log π − log π_old) / |y_i|;  per token
    log s_{i,t} = sg(log s_i) + log π_t − sg(log π_t), clamped ≤ 10, so the value is the sequence
    ratio and ∂s_{i,t}/∂log π_t = s_i.  Loss = max(−A·s, −A·clip(s, 1−ε_low, 1+ε_high)), aggregated
    with ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says (as veRL).
    Metrics: ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` (= 0).
    Shapes: inputs ``(bs, response_length)``; loss is a scalar.
    """
    neg_kl = log_prob - old_log_prob
    mask = response_mask.to(neg_kl.dtype)
    seq_len = mask.sum(dim=-1).clamp(min=1)
    masked_neg_kl = torch.where(response_mask.bool(), neg_kl, torch.zeros_like(neg_kl))
    log_seq_ratio = masked_neg_kl.sum(dim=-1) / seq_len
    log_ratio = log_prob - log_prob.detach() + log_seq_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    pg_losses = torch.maximum(losses1, losses2)
    loss = agg_loss(weighted(pg_losses, rollout_is_weights), response_mask, "seq-mean-token-mean")
    return loss, _metrics(
        float(masked_mean(torch.gt(losses2, losses1).float(), response_mask)), neg_kl, response_mask
    )


@dataclass(frozen=True)
class CISPOConfig(FrozenParams):
    """CISPO clip range of the IS weight.  The paper bounds only the top (ε_high = 0.28) and sets
    ε_low so large that there is no lower bound; defaults as Trinity-RFT (1.0 / 0.28)."""

    clip_ratio_low: float = 1.0
    clip_ratio_high: float = 0.28

    _aliases: ClassVar[Mapping[str, str]] = _RANGE_ALIASES


@register_policy_loss("cispo", config_cls=CISPOConfig)
def compute_policy_loss_cispo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
):
    """Clipped IS-weight Policy Optimization (MiniMax-M1), https://arxiv.org/abs/2506.13585.

    loss_t = −sg(clip(r_t, 1−ε_low, 1+ε_high))·A_t·log π_t, so ∂loss/∂log π = −clip(r)·A for every
    token (no token is dropped as in PPO).  pg_clipfrac = mean_m[r ≠ clip(r)].
    Shapes: inputs ``(bs, response_length)``; loss is a scalar.
    """
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl).detach()
    clipped = torch.clamp(ratio, 1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    pg_losses = -clipped * advantages * log_prob
    loss = agg_loss(weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode)
    return loss, _metrics(
        float(masked_mean(torch.ne(ratio, clipped).float(), response_mask)), neg_kl, response_mask
    )


@dataclass(frozen=True)
class SAPOConfig(FrozenParams):
    """SAPO gate temperatures: τ+ = 1.0 for A > 0, τ− = 1.05 otherwise (veRL, Trinity-RFT)."""

    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self) -> None:
        if self.tau_pos <= 0 or self.tau_neg <= 0:
            raise ValueError(
                f"SAPO temperatures must be > 0, got tau_pos={self.tau_pos}, tau_neg={self.tau_neg}"
            )


@register_policy_loss("sapo", config_cls=SAPOConfig)
def compute_policy_loss_sapo(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
):
    """Soft Adaptive Policy Optimization (Qwen), https://arxiv.org/abs/2511.20347.

    Instead of a hard clip a smooth gate f(r) = σ(τ·(r − 1))·4/τ with τ = τ+ if A > 0 else τ−;
    loss = −f(r)·A (f(1) = 2/τ, f'(1) = 1, so on-policy it has the PPO gradient).  Aggregated with
    ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says (as veRL).  Both clipfracs are 0.
    Shapes: inputs ``(bs, response_length)``; loss is a scalar.
    """
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    tau = torch.where(advantages > 0, config.tau_pos, config.tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gate * advantages
    loss = agg_loss(weighted(pg_losses, rollout_is_weights), response_mask, "seq-mean-token-mean")
    return loss, _metrics(0.0, neg_kl, response_mask)


@dataclass(frozen=True)
class GPGConfig(FrozenParams):
    """GPG has no parameters."""


@register_policy_loss("gpg", config_cls=GPGConfig)
def compute_policy_loss_gpg(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
):
    """Group Policy Gradient, https://arxiv.org/abs/2504.02546: loss = −log π·A (no ratio, no clip).

    ``old_log_prob`` is unused.  Returns no metrics (as veRL).
    Shapes: inputs ``(bs, response_length)``; loss is a scalar.
    """
    del old_log_prob, config
    pg_losses = -log_prob * advantages
    return agg_loss(weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode), {}
