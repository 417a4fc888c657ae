"""Losses for data that does not come with advantages: SFT and DPO.

Both use the shared policy-loss signature so the actor needs no special case: SFT ignores
``old_log_prob`` and ``advantages``.  DPO is registered with ``reads_reference`` (the actor passes
the frozen reference model's log-probs in the first argument) and ``pairwise`` (rows arrive as
adjacent (chosen, rejected) pairs: the trainer expands each pair experience into two rows and
every shard, mini-batch and micro-batch split keeps a pair together).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .aggregation import agg_loss
from .masked import masked_sum
from .params import FrozenParams
from .policy_loss_common import register_policy_loss, weighted

__all__ = ["DPOConfig", "SFTConfig", "compute_dpo_loss", "compute_sft_loss"]


@dataclass(frozen=True)
class SFTConfig(FrozenParams):
    """SFT has no parameters."""


@register_policy_loss("sft", config_cls=SFTConfig)
def compute_sft_loss(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
):
    """Token negative log-likelihood on the mask: loss = agg(−log π, m).

    Metric ``actor/sft_loss``.  Shapes: log_prob, response_mask ``(bs, response_length)``.
    """
    del old_log_prob, advantages, config
    loss = agg_loss(weighted(-log_prob, rollout_is_weights), response_mask, loss_agg_mode)
    return loss, {"actor/sft_loss": float(loss.detach())}


@dataclass(frozen=True)
class DPOConfig(FrozenParams):
    """DPO inverse temperature β (0.1) and conservative label smoothing (0.0)."""

    beta: float = 0.1
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")


@register_policy_loss("dpo", config_cls=DPOConfig, reads_reference=True, pairwise=True)
def compute_dpo_loss(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
):
    """Direct Preference Optimization, https://arxiv.org/abs/2305.18290.

    Rows 0, 2, 4, … are chosen responses, rows 1, 3, 5, … the rejected ones; ``old_log_prob`` holds
    the reference log-probs.  With Δ_w = Σ_t m(log π − log π_ref) on the chosen row and Δ_l on the
    rejected one, z = β(Δ_w − Δ_l):
    loss = mean_pairs[−(1−s)·log σ(z) − s·log σ(−z)]   (s = label_smoothing; ``loss_agg_mode`` unused:
    the loss is a mean over pairs, so the trainer weights micro-batches by sequences).
    Metrics (Trinity-RFT's names): ``actor/dpo_loss``, ``actor/chosen_reward`` (β·mean Δ_w),
    ``actor/rejected_reward`` (β·mean Δ_l), ``actor/accuracy_mean`` (fraction with Δ_w > Δ_l),
    ``actor/reward_margin`` (β·mean(Δ_w − Δ_l)).
    Shapes: log_prob, old_log_prob, response_mask ``(2·n_pairs, response_length)``.
    """
    del advantages, loss_agg_mode
    if log_prob.shape[0] % 2:
        raise ValueError(f"DPO needs (chosen, rejected) row pairs; got an odd batch of {log_prob.shape[0]}")
    if old_log_prob is None:
        raise ValueError("DPO needs the reference log-probs as old_log_prob")
    seq_logp = masked_sum(log_prob, response_mask, dim=-1)
    seq_ref = masked_sum(old_log_prob.detach(), response_mask, dim=-1)
    if rollout_is_weights is not None:
        raise ValueError("DPO does not take rollout_is_weights")
    chosen, rejected = seq_logp[0::2] - seq_ref[0::2], seq_logp[1::2] - seq_ref[1::2]
    z = config.beta * (chosen - rejected)
    losses = -F.logsigmoid(z) * (1 - config.label_smoothing) - F.logsigmoid(-z) * config.label_smoothing
    loss = losses.mean() if losses.numel() else losses.sum()
    with torch.no_grad():
        n = max(chosen.numel(), 1)
        metrics = {
            "actor/dpo_loss": float(loss),
            "actor/chosen_reward": float(config.beta * chosen.sum() / n),
            "actor/rejected_reward": float(config.beta * rejected.sum() / n),
            "actor/accuracy_mean": float((chosen > rejected).float().sum() / n),
            "actor/reward_margin": float(config.beta * (chosen - rejected).sum() / n),
        }
    return loss, metrics
