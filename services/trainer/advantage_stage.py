"""Rewards shaping and advantages of one step, by name (the algorithm half of the step loop).

Between the forward passes (old/ref log-probs, values) and the updates: the scores become
`token_level_rewards` (minus β·KL(old ‖ ref) per token when `kl_penalty_fn` is set, veRL's
`use_kl_in_reward`), then the configured estimator fills `advantages` and `returns`.  Every rank runs
this on the whole batch (it is cheap and deterministic), so groups spanning ranks are never split.
"""

from __future__ import annotations

import torch

from services.trainer.algorithms import (
    AlgorithmPreset,
    KLController,
    TrainBatch,
    apply_kl_penalty,
    compute_advantage,
)

__all__ = ["shape_rewards_and_advantages"]


def shape_rewards_and_advantages(
    batch: TrainBatch, preset: AlgorithmPreset, kl_ctrl: KLController
) -> tuple[TrainBatch, dict[str, float]]:
    """Return the batch with `token_level_rewards`, `advantages` and `returns` set, and metrics."""
    metrics: dict[str, float] = {}
    scores = batch.require("token_level_scores")
    rewards = scores
    if preset.use_kl_in_reward:
        rewards, kl_metrics = apply_kl_penalty(
            scores,
            batch.require("old_log_probs"),
            batch.require("ref_log_probs"),
            batch.response_mask,
            kl_ctrl.value,
            preset.kl_penalty_fn,
        )
        kl_ctrl.update(kl_metrics["actor/reward_kl_penalty"], batch.batch_size)
        metrics |= kl_metrics
    batch = batch.replace(token_level_rewards=rewards)
    if preset.advantage_fn is not None:
        batch = compute_advantage(batch, preset.advantage_fn, **dict(preset.advantage_fn_args))
    elif batch.advantages is None:  # sft / dpo: no advantages; keep the fields defined for metrics
        zeros = torch.zeros_like(batch.response_mask, dtype=torch.float32)
        batch = batch.replace(advantages=zeros, returns=zeros)
    elif batch.returns is None:
        batch = batch.replace(returns=batch.advantages)
    return batch, metrics
