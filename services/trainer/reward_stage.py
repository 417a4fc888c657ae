"""The reward manager of a run: shapes the explorer's rewards before KL shaping and advantages.

Rewards are computed by the explorer's workflows and arrive as `token_level_scores`; the manager
named by `algorithm.reward_manager` (or the `algorithm_type` preset: `dapo` for DAPO) then shapes
them, as veRL's reward managers do after scoring. `naive` leaves them as they are; `dapo` adds the
soft overlong punishment of DAPO (https://arxiv.org/abs/2503.14476): with L_max =
`reward_manager_args.max_resp_len` (default: the rollout's max response tokens) and
L_cache = `overlong_buffer.len`, a response of length L gets
0 for L <= L_max - L_cache, ((L_max - L_cache) - L) / L_cache x penalty_factor up to L_max, and
-penalty_factor beyond. The manager's metrics (`reward/overlong_penalty_mean`,
`reward/overlong_ratio`) go into the step's metrics, and `critic/score/*` includes the penalty.
"""

from __future__ import annotations

import inspect
from typing import Any

from services.trainer.algorithms import AlgorithmPreset, TrainBatch, get_reward_manager_cls

__all__ = ["apply_reward_manager", "make_reward_manager"]


def make_reward_manager(preset: AlgorithmPreset, tokenizer: Any, max_response_tokens: int | None) -> Any:
    """The preset's reward manager with its `reward_manager_args`; bad args raise `ValueError`
    naming `algorithm.reward_manager_args`."""
    cls = get_reward_manager_cls(preset.reward_manager)
    args = dict(preset.reward_manager_args)
    if "overlong_buffer" in args:
        args["overlong_buffer_cfg"] = args.pop("overlong_buffer")
    if "max_resp_len" in inspect.signature(cls).parameters:
        args["max_resp_len"] = args.get("max_resp_len") or max_response_tokens
    try:
        return cls(tokenizer, **args)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"algorithm.reward_manager_args of {preset.reward_manager!r}: {exc}; the overlong buffer "
            f"needs max_resp_len (default model.max_response_tokens = {max_response_tokens}) >= "
            "overlong_buffer.len: set algorithm.reward_manager_args.overlong_buffer.len (or "
            "max_response_tokens) accordingly"
        ) from None


def apply_reward_manager(batch: TrainBatch, manager: Any) -> tuple[TrainBatch, dict[str, float]]:
    """`batch` with its `token_level_scores` shaped by `manager`, and the manager's metrics."""
    result, metrics = manager.shape_scores(batch)
    scores = result.reward_tensor
    return batch.replace(token_level_scores=scores, token_level_rewards=scores), metrics
