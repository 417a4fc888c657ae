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
- `cispo`: our `cispo`, sum(-sg(clip(r, clip_low_threshold, clip_high_threshold)) * A * log p)
  (defaults 0.0 and 4.0, Tinker's one-sided clip).
- `gspo`: our `gspo` (GSPO-token): every token carries the sequence ratio
  s = exp(mean over `sequence_ratio_mask` of (log p - sampler log p)) as its value and its own
  log p's gradient; sum(-min(s*A, clip(s, clip_low_threshold, clip_high_threshold)*A)) over every
  token. Defaults 0.9997 and 1.0004 (our GSPO's, the paper's ε 3e-4 and 4e-4). Our loss averages the
  log-ratio over its response mask and token-means each sequence; the server gives it every real
  token as the mask, each row's token count as the per-token weight (so the token mean becomes the
  sum), and an `old_log_prob` whose log-ratio averages over the whole row to the mean over the ratio
  mask (its value only: our loss detaches the sequence ratio).
- `dro`: sum(-(A * log p - beta/2 * (log p - sampler log p)^2)), Tinker's quadratic penalty; `beta`
  has no default (the server will not guess one).
"""

from __future__ import annotations

import torch

from services.trainer.algorithms.registries import get_policy_loss_fn

_OFF = 1.0e9  # a clip bound no ratio reaches (ratios are clamped to exp(20))
_AGG = "seq-mean-token-sum"

_RL = ("target_tokens", "logprobs", "advantages")
NEEDS = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": _RL,
    "ppo": _RL,
    "cispo": _RL,
    "gspo": (*_RL, "sequence_ratio_mask"),
    "dro": _RL,
}
# loss_fn_config keys each loss takes, with their defaults (None: required)
CONFIG: dict[str, dict[str, float | None]] = {
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "gspo": {"clip_low_threshold": 1.0 - 3e-4, "clip_high_threshold": 1.0 + 4e-4},
    "dro": {"beta": None},
}


class LossError(ValueError):
    """A loss name or loss input the server cannot use."""


def check(name: str, config: dict[str, float | str]) -> None:
    if name not in NEEDS:
        raise LossError(f"loss_fn {name!r} is not supported by this server; supported: {', '.join(NEEDS)}")
    allowed = CONFIG.get(name, {})
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise LossError(f"loss_fn_config for {name!r}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(k for k, default in allowed.items() if default is None and k not in config)
    if missing:
        raise LossError(f"loss_fn_config for {name!r} needs {missing} (no default)")
    for key in allowed:
        if key in config and not isinstance(config[key], float):
            raise LossError(f"loss_fn_config[{key!r}] for {name!r}: a number, got {config[key]!r}")


def _option(name: str, config: dict[str, float | str], key: str) -> float:
    value = config.get(key, CONFIG[name][key])
    assert value is not None, f"{name}: {key} is checked by check()"
    return float(value)


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
    elif name == "gspo":
        loss = _gspo(config, log_prob, inputs, mask)
    elif name == "dro":
        beta = _option(name, config, "beta")
        penalty = (log_prob - inputs["logprobs"]) ** 2
        loss = -((log_prob * inputs["advantages"] - 0.5 * beta * penalty) * mask).sum() / bs
    else:
        if name in ("ppo", "cispo"):  # Tinker's thresholds bound the ratio; ours are distances from 1
            low = 1.0 - _option(name, config, "clip_low_threshold")
            high = _option(name, config, "clip_high_threshold") - 1.0
            clip = {"clip_ratio_low": low, "clip_ratio_high": high}
            if name == "ppo":
                clip["clip_ratio_c"] = _OFF
        else:
            clip = {"clip_ratio": _OFF, "clip_ratio_c": _OFF}
        loss, _ = get_policy_loss_fn("cispo" if name == "cispo" else "ppo")(
            inputs["logprobs"], log_prob, inputs["advantages"], mask, _AGG, clip
        )
    loss = loss * bs
    return loss, {"loss:sum": float(loss.detach())}


def _gspo(
    config: dict[str, float | str],
    log_prob: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    mask: torch.Tensor,
) -> torch.Tensor:
    """Tinker's gspo through our `gspo` loss, divided by `bs` as the other losses (see the docstring)."""
    clip = {
        "clip_ratio_low": 1.0 - _option("gspo", config, "clip_low_threshold"),
        "clip_ratio_high": _option("gspo", config, "clip_high_threshold") - 1.0,
    }
    in_ratio = (inputs["sequence_ratio_mask"] != 0).to(mask.dtype) * mask
    n_real = mask.sum(-1, keepdim=True).clamp(min=1)
    n_ratio = in_ratio.sum(-1, keepdim=True).clamp(min=1)
    lp = log_prob.detach()
    old = lp - (lp - inputs["logprobs"]) * in_ratio * (n_real / n_ratio)
    weights = n_real.expand_as(mask)
    loss, _ = get_policy_loss_fn("gspo")(old, log_prob, inputs["advantages"], mask, _AGG, clip, weights)
    return loss
