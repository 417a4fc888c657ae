"""Outcome advantage estimators that compare samples of the same prompt (a group).

Each sample i has a scalar outcome R_i = Σ_t token_level_rewards[i, t]; ``index`` gives its group
g(i) (the prompt's uid).  The advantage is a scalar per sample broadcast over its response tokens
(× response_mask); returns are the same tensor.  Groups are handled vectorised (``index_add``),
with exactly the statistics of veRL's per-group loops, including its edge cases (a group of one).
Statistics are computed in float64 and the result is cast back to the rewards' dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .registries import ADVANTAGE_FNS

__all__ = [
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "group_ids",
]


def group_ids(index: Sequence[str | int] | torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """Map group labels (str or int, any order) to dense ids 0..G−1 in order of first appearance."""
    labels = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    dense: dict[str | int, int] = {}
    ids = [dense.setdefault(label, len(dense)) for label in labels]
    return torch.tensor(ids, dtype=torch.long, device=device)


def _group_sums(values: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    n_groups = int(gid.max()) + 1 if gid.numel() else 0
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, gid, values)


def _outcome(token_level_rewards: torch.Tensor, index: Sequence[str | int] | torch.Tensor):
    if len(index) != token_level_rewards.shape[0]:
        raise ValueError(f"index has {len(index)} entries for a batch of {token_level_rewards.shape[0]}")
    # float64 group statistics: a group of equal rewards then has a deviation of exactly 0
    scores = token_level_rewards.detach().to(torch.float64).sum(dim=-1)
    gid = group_ids(index, device=scores.device)
    counts = _group_sums(torch.ones_like(scores), gid)
    return scores, gid, counts


def _broadcast(per_sample: torch.Tensor, like: torch.Tensor, response_mask: torch.Tensor):
    adv = (per_sample.unsqueeze(-1) * response_mask.to(per_sample.dtype)).to(like.dtype)
    return adv, adv


@ADVANTAGE_FNS.register("grpo")
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[str | int] | torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: A_i = (R_i − mean_g) / (std_g + ε); Dr.GRPO when ``norm_adv_by_std_in_grpo=False``:
    A_i = R_i − mean_g.

    std is the unbiased sample std of the group.  A group of one has mean 0 and std 1 (so
    A = R/(1+ε)), as in veRL; equal rewards give std 0 and A = 0.
    Papers: DeepSeekMath https://arxiv.org/abs/2402.03300, Dr.GRPO https://arxiv.org/abs/2503.20783.
    Shapes: token_level_rewards, response_mask ``(bs, response_length)``; index ``bs`` group ids;
    returns (advantages, returns), both ``(bs, response_length)``.
    """
    scores, gid, counts = _outcome(token_level_rewards, index)
    mean = _group_sums(scores, gid) / counts
    sq_dev = (scores - mean[gid]) ** 2
    std = (_group_sums(sq_dev, gid) / (counts - 1).clamp(min=1)).sqrt()
    single = counts[gid] == 1
    mean_i = torch.where(single, torch.zeros_like(scores), mean[gid])
    std_i = torch.where(single, torch.ones_like(scores), std[gid])
    adv = (scores - mean_i) / (std_i + epsilon) if norm_adv_by_std_in_grpo else scores - mean_i
    return _broadcast(adv, token_level_rewards, response_mask)


@ADVANTAGE_FNS.register("rloo")
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[str | int] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: A_i = R_i − mean_{j≠i} R_j = n/(n−1)·(R_i − mean_g); a group of one gets A = R.

    Paper: Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740.
    Shapes: as ``compute_grpo_outcome_advantage``.
    """
    scores, gid, counts = _outcome(token_level_rewards, index)
    mean = _group_sums(scores, gid) / counts
    n = counts[gid]
    adv = torch.where(n > 1, (scores - mean[gid]) * n / (n - 1).clamp(min=1), scores)
    return _broadcast(adv, token_level_rewards, response_mask)


@ADVANTAGE_FNS.register("opo")
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[str | int] | torch.Tensor,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: A_i = R_i − b_g with the length-weighted baseline b_g = Σ_j |y_j|·R_j / Σ_j |y_j|.

    |y_j| = Σ_t response_mask[j, t].  A group of one has b = 0 (veRL); a group whose responses
    are all empty has b = 0 too (veRL divides by zero).  ``epsilon`` is accepted for veRL
    compatibility and unused, as there.
    Paper: On-Policy RL with Optimal Reward Baseline, https://arxiv.org/abs/2505.23585.
    Shapes: as ``compute_grpo_outcome_advantage``.
    """
    del epsilon
    scores, gid, counts = _outcome(token_level_rewards, index)
    lengths = response_mask.to(scores.dtype).sum(dim=-1)
    weighted = _group_sums(lengths * scores, gid)
    total_len = _group_sums(lengths, gid)
    baseline = torch.where(total_len > 0, weighted / total_len.clamp(min=1e-8), torch.zeros_like(total_len))
    baseline_i = torch.where(counts[gid] > 1, baseline[gid], torch.zeros_like(scores))
    return _broadcast(scores - baseline_i, token_level_rewards, response_mask)


@ADVANTAGE_FNS.register("gpg")
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[str | int] | torch.Tensor,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: A_i = α·(R_i − mean_g)/f_norm with α = B / count_nonzero(R) over the whole batch.

    No std normalisation; α rescales the batch by its share of nonzero scores (at least one).  A
    group of one has mean 0 (veRL).  ``epsilon`` is accepted for veRL compatibility and unused.
    Paper: GPG: A Simple and Strong Reinforcement Learning Baseline, https://arxiv.org/abs/2504.02546.
    Shapes: as ``compute_grpo_outcome_advantage``.
    """
    del epsilon
    if f_norm <= 0:
        raise ValueError(f"advantage_fn_args.f_norm must be > 0, got {f_norm}")
    scores, gid, counts = _outcome(token_level_rewards, index)
    alpha = scores.numel() / max(int(torch.count_nonzero(scores)), 1)
    mean = _group_sums(scores, gid) / counts
    mean_i = torch.where(counts[gid] > 1, mean[gid], torch.zeros_like(scores))
    return _broadcast(alpha * (scores - mean_i) / f_norm, token_level_rewards, response_mask)
