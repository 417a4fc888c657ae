"""Run an advantage estimator by name on a ``TrainBatch``.

Estimators take different inputs (GAE needs values, GRPO group ids, ReMax baselines).  Instead of
an ``if name == …`` chain, the estimator's signature says what it needs: parameters named like a
batch input are filled from the batch, everything else must come from the config's
``advantage_fn_args`` and is checked (an unknown argument is an error naming it).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from .batch import TrainBatch
from .params import unknown_key_error
from .registries import get_advantage_fn

__all__ = ["BATCH_INPUTS", "check_advantage_args", "compute_advantage"]

# estimator parameter name -> TrainBatch field
BATCH_INPUTS: Mapping[str, str] = {
    "token_level_rewards": "token_level_rewards",
    "response_mask": "response_mask",
    "values": "values",
    "reward_baselines": "reward_baselines",
    "index": "uid",
}
# why a batch input may be missing, for the error message
_MISSING_HINTS: Mapping[str, str] = {
    "reward_baselines": (
        "; the explorer sets Experience.reward_baseline (a greedy rollout's reward) only when "
        "algorithm.advantage_fn (or algorithm_type) is 'remax' in its config"
    ),
}


def check_advantage_args(adv_estimator: str, args: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` if ``args`` holds a key the estimator does not take."""
    params = inspect.signature(get_advantage_fn(adv_estimator)).parameters
    allowed = [p for p in params if p not in BATCH_INPUTS]
    for key in args:
        if key not in allowed:
            raise unknown_key_error(f"advantage_fn_args of {adv_estimator!r}", key, allowed)


def compute_advantage(batch: TrainBatch, adv_estimator: str, **args: Any) -> TrainBatch:
    """Return ``batch`` with ``advantages`` and ``returns`` set by the named estimator.

    ``args`` are the estimator's own parameters (``gamma``, ``lam``, ``epsilon``, …).
    """
    fn = get_advantage_fn(adv_estimator)
    check_advantage_args(adv_estimator, args)
    kwargs: dict[str, Any] = {}
    for name in inspect.signature(fn).parameters:
        if name in BATCH_INPUTS:
            field = BATCH_INPUTS[name]
            value = getattr(batch, field)
            if value is None:
                raise ValueError(
                    f"advantage estimator {adv_estimator!r} needs TrainBatch.{field}, which is None"
                    + _MISSING_HINTS.get(field, "")
                )
            kwargs[name] = value
    advantages, returns = fn(**kwargs, **args)
    return batch.replace(advantages=advantages, returns=returns)
