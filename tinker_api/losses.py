"""Tinker loss names mapped onto our registered policy losses (services/trainer/algorithms).

Tinker sums each loss over every token of the batch. Our losses take padded `(bs, T)` tensors and
aggregate; with `seq-mean-token-sum` times `bs` the aggregate is that same sum. Per-token inputs:
`target_tokens` (the next tokens), `weights` (cross_entropy's per-token weight: our rollout IS weights
on the SFT loss), `logprobs` (the sampler's log-probs: our `old_log_prob`) and `advantages`.

- `cross_entropy`: our `sft` loss, sum(-weights * log p(target)).
- `importance_sampling`: our `ppo` surrogate with the clip and the dual clip turned off,
  sum(-advantages * exp(log p - sampler log p)), Tinker's REINFORCE with importance sampling.
- `ppo`: our `ppo` clip with ε_low = 1 - clip_low_threshold, ε_high = clip_high_threshold - 1
  (loss_fn_config; defaults 0.8 and 1.2) and no dual clip, as Tinker's.
"""

from __future__ import annotations

import torch

from services.trainer.algorithms.registries import get_policy_loss_fn

_OFF = 1.0e9  # a clip bound no ratio reaches (ratios are clamped to exp(20))
_AGG = "seq-mean-token-sum"

NEEDS = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
}


class LossError(ValueError):
    """A loss name or loss input the server cannot use."""


def check(name: str, config: dict[str, float | str]) -> None:
    if name not in NEEDS:
        raise LossError(f"loss_fn {name!r} is not supported by this server; supported: {', '.join(NEEDS)}")
    allowed = {"clip_low_threshold", "clip_high_threshold"} if name == "ppo" else set()
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise LossError(f"loss_fn_config for {name!r}: unknown keys {unknown}; allowed: {sorted(allowed)}")


def compute(
    name: str,
    config: dict[str, float | str],
    log_prob: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The summed loss of `log_prob` (bs, T) under loss `name`; `mask` marks the real positions."""
    bs = log_prob.shape[0]
    if name == "cross_entropy":
        weights = inputs.get("weights", mask)
        loss, _ = get_policy_loss_fn("sft")(None, log_prob, None, mask, _AGG, None, weights)
    else:
        if name == "ppo":
            low = 1.0 - float(config.get("clip_low_threshold", 0.8))
            high = float(config.get("clip_high_threshold", 1.2)) - 1.0
            clip = {"clip_ratio_low": low, "clip_ratio_high": high, "clip_ratio_c": _OFF}
        else:
            clip = {"clip_ratio": _OFF, "clip_ratio_c": _OFF}
        loss, _ = get_policy_loss_fn("ppo")(
            inputs["logprobs"], log_prob, inputs["advantages"], mask, _AGG, clip
        )
    loss = loss * bs
    return loss, {"loss:sum": float(loss.detach())}
