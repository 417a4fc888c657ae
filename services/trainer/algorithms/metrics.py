"""Batch data metrics with veRL's names (``compute_data_metrics`` in ``metric_utils.py``).

Keeping veRL's metric names lets dashboards and run comparisons carry over unchanged.  An
"aborted" sample is one with an empty response; scores and rewards are reported over the others.
Statistics of an empty selection are reported as 0.0 (veRL would raise or give NaN).
"""

from __future__ import annotations

import torch

from .batch import TrainBatch

__all__ = ["compute_data_metrics", "rollout_probs_diff"]


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.detach().float()
    if values.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def compute_data_metrics(batch: TrainBatch, use_critic: bool = True) -> dict[str, float]:
    """veRL data metrics of one training batch.

    Reads ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns``,
    ``response_mask``, ``prompt_mask`` (and ``values`` with a critic).  Produces
    ``critic/{score,rewards,advantages,returns}/{mean,max,min}``; with a critic also
    ``critic/values/{…}`` and ``critic/vf_explained_var`` = 1 − Var(R − V)/(Var(R) + 1e-5);
    ``response_length/{mean,max,min,clip_ratio}`` and ``response_length_non_aborted/{…}``,
    ``response/aborted_ratio``, ``prompt_length/{mean,max,min,clip_ratio}``.
    Sequence score = Σ_t token_level_scores; response length = Σ_t response_mask; clip ratio =
    fraction of samples at the padded length.  Per-token statistics are over masked tokens.
    """
    mask = batch.response_mask.bool()
    scores = batch.require("token_level_scores").detach().float().sum(dim=-1)
    rewards = batch.require("token_level_rewards").detach().float().sum(dim=-1)
    advantages = batch.require("advantages").detach().float()
    returns = batch.require("returns").detach().float()
    prompt_mask = batch.require("prompt_mask")

    response_length = batch.response_mask.float().sum(dim=-1)
    prompt_length = prompt_mask.float().sum(dim=-1)
    aborted = response_length == 0
    alive = ~aborted
    valid_returns = torch.masked_select(returns, mask)

    metrics: dict[str, float] = {}
    metrics |= _stats("critic/score", scores[alive])
    metrics |= _stats("critic/rewards", rewards[alive])
    metrics |= _stats("critic/advantages", torch.masked_select(advantages, mask))
    metrics |= _stats("critic/returns", valid_returns)
    if use_critic:
        valid_values = torch.masked_select(batch.require("values").detach().float(), mask)
        metrics |= _stats("critic/values", valid_values)
        if valid_returns.numel() > 1:
            diff_var = torch.var(valid_returns - valid_values)
            explained = 1.0 - diff_var / (torch.var(valid_returns) + 1e-5)
            metrics["critic/vf_explained_var"] = float(explained)
        else:
            metrics["critic/vf_explained_var"] = 0.0

    def ratio(flags: torch.Tensor) -> float:
        return float(flags.float().mean()) if flags.numel() else 0.0

    max_response = batch.response_length
    metrics |= _stats("response_length", response_length)
    metrics["response_length/clip_ratio"] = ratio(response_length == max_response)
    metrics |= _stats("response_length_non_aborted", response_length[alive])
    metrics["response_length_non_aborted/clip_ratio"] = ratio(response_length[alive] == max_response)
    metrics["response/aborted_ratio"] = ratio(aborted)
    metrics |= _stats("prompt_length", prompt_length)
    metrics["prompt_length/clip_ratio"] = ratio(prompt_length == prompt_mask.shape[-1])
    return metrics


def rollout_probs_diff(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``[sum, count, max]`` (float64, CPU) of |p_rollout - p_old| over the masked response tokens, the
    parts of veRL's ``training/rollout_probs_diff_{mean,max}``: p_rollout is the probability the rollout
    engine reported for the sampled token, p_old the trainer's.  Near 0 when the explorer samples from
    the weights being trained (up to kernel differences); large values mean the two models differ
    (a stale or broken weight sync)."""
    keep = mask.bool()
    diff = (rollout_log_probs.detach().float().exp() - old_log_probs.detach().float().exp()).abs()[keep]
    if diff.numel() == 0:
        return torch.zeros(3, dtype=torch.float64)
    # the count on the tensors' device: torch.stack refuses a CPU scalar beside CUDA ones
    return torch.stack([diff.sum(), diff.new_tensor(float(diff.numel())), diff.max()]).double().cpu()
