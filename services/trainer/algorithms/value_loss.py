"""Clipped value-function loss for the PPO critic.

PPO (https://arxiv.org/abs/1707.06347) with value clipping as in OpenAI baselines and veRL
``compute_value_loss``: the new prediction may not move the loss below what a prediction within
``cliprange_value`` of the old one would give.
"""

from __future__ import annotations

import torch

from .aggregation import agg_loss
from .masked import masked_mean

__all__ = ["compute_value_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """vf_loss = ½·agg(max((v − R)², (v_clip − R)²)),  v_clip = clip(v, v_old − c, v_old + c).

    vf_clipfrac = mean_m[(v_clip − R)² > (v − R)²].  Defaults: c = 0.5, token-mean.
    Shapes: vpreds (new values), returns, values (old values), response_mask
    ``(bs, response_length)``; returns ``(vf_loss, vf_clipfrac)`` scalars.
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    losses_unclipped = (vpreds - returns) ** 2
    losses_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(losses_unclipped, losses_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac
