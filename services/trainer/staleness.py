"""Per-token staleness: how many versions behind the trainer each trained token's weights were.

With in-flight weight updates an experience's tokens may come from several versions
(`Experience.token_model_versions`, (R,)); without them every token is of `model_version`. The
trainer's staleness bound (`max_staleness`: the buffer leases only experiences whose `model_version`,
the oldest of their tokens, is >= trainer version - max_staleness) therefore bounds every token; a
producer whose `model_version` is not its oldest token still cannot slip an older token in:
`mask_stale_tokens` takes such tokens out of the action mask (they get no loss). Rollout importance
sampling needs nothing more: each token's rollout log-prob is under the weights that sampled it, so
ρ_t = π_old(y_t) / π_rollout(y_t) compares each token with its own version.

Metrics over the model's tokens (action mask), staleness_t = trainer version - version_t:
`sample/token_staleness/{mean,max}`, `sample/mixed_version_fraction` (experiences whose tokens span
more than one version) and `sample/stale_tokens_masked`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.common.experience import Experience

__all__ = ["mask_stale_tokens", "token_staleness_metrics"]


def _model_tokens(exp: Experience) -> torch.Tensor:
    """(R,) bool: the tokens the model generated."""
    if exp.action_mask is not None:
        return exp.action_mask
    return torch.ones(exp.response_length, dtype=torch.bool)


def mask_stale_tokens(experiences: Sequence[Experience], min_version: int) -> int:
    """Drop from each experience's action mask the tokens of a version below `min_version`; returns
    how many model tokens were dropped (0 when no experience carries per-token versions)."""
    dropped = 0
    for exp in experiences:
        if exp.token_model_versions is None or min_version <= 0:
            continue
        mask = _model_tokens(exp)
        stale = mask & (exp.token_model_versions < min_version)
        n = int(stale.sum())
        if n:
            exp.action_mask = mask & ~stale
            dropped += n
    return dropped


def token_staleness_metrics(experiences: Sequence[Experience], trainer_version: int) -> dict[str, float]:
    """Staleness per model token (module docstring), over the whole batch."""
    if not experiences:
        return {}
    per_token = [trainer_version - exp.versions_per_token()[_model_tokens(exp)] for exp in experiences]
    flat = torch.cat(per_token) if per_token else torch.zeros(0, dtype=torch.int64)
    mixed = sum(
        1
        for exp in experiences
        if exp.token_model_versions is not None and exp.token_model_versions.unique().numel() > 1
    )
    return {
        "sample/token_staleness/mean": float(flat.double().mean()) if flat.numel() else 0.0,
        "sample/token_staleness/max": float(flat.max()) if flat.numel() else 0.0,
        "sample/mixed_version_fraction": mixed / len(experiences),
    }
