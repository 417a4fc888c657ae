"""Advantage estimators built on per-token returns: GAE, REINFORCE++ and ReMax.

Unlike the group estimators these scan the response right to left.  GAE needs critic values;
REINFORCE++ whitens discounted returns over the whole batch; ReMax subtracts the reward of a
greedy rollout.  The loops run over ``response_length`` (vectorised over the batch) as in veRL.
"""

from __future__ import annotations

import torch

from .masked import masked_whiten
from .registries import ADVANTAGE_FNS

__all__ = [
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
]


@ADVANTAGE_FNS.register("gae", "ppo")
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation.

    δ_t = r_t + γ·V_{t+1} − V_t;  Â_t = δ_t + γλ·Â_{t+1};  returns = Â + V (before whitening);
    then Â ← masked_whiten(Â, m) over the whole batch.  Masked (observation) tokens carry the next
    value and the running Â through unchanged, so multi-turn responses skip tool output.
    Defaults γ = λ = 1 (veRL, Trinity-RFT).  Paper: https://arxiv.org/abs/1506.02438.
    Shapes: token_level_rewards, values, response_mask ``(bs, response_length)``;
    returns (advantages, returns) ``(bs, response_length)``.
    """
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    reversed_adv = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        last_gae = gae_t * mask[:, t] + (1 - mask[:, t]) * last_gae
        reversed_adv.append(last_gae)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, response_mask).to(values.dtype), returns


@ADVANTAGE_FNS.register("reinforce_plus_plus", "reinforceplusplus")
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: G_t = r_t + γ·G_{t+1} (reset after the last valid token via the mask);
    A = masked_whiten(G, m)·m over the whole batch; returns = G.

    Paper: https://arxiv.org/abs/2501.03262.  Shapes: ``(bs, response_length)`` in and out.
    """
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    mask = response_mask.to(token_level_rewards.dtype)
    for t in reversed(range(token_level_rewards.shape[-1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    advantages = masked_whiten(returns, response_mask).to(token_level_rewards.dtype)
    return advantages, returns


@ADVANTAGE_FNS.register("remax")
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: G_t = Σ_{s≥t} r_s·m_s (reverse cumulative sum); A_t = G_t − b·m_t with b the
    reward of the greedy response to the same prompt.

    Paper: https://arxiv.org/abs/2310.10505.
    Shapes: token_level_rewards, response_mask ``(bs, response_length)``; reward_baselines ``(bs,)``.
    """
    masked = torch.where(response_mask.bool(), token_level_rewards, torch.zeros_like(token_level_rewards))
    returns = masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1).to(returns.dtype) * response_mask.to(returns.dtype)
    return advantages, returns
