"""The registries of this package and the ``get_*`` lookups that configs use.

Modules register their functions here at import time (the package ``__init__`` imports them all,
so a lookup always sees every built-in).  Each ``get_*`` also resolves ``pkg.mod:obj`` plug-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.common.registry import Registry
from services.common.rewards import REWARD_SCORERS, get_scorer

__all__ = [
    "ADVANTAGE_FNS",
    "KL_FNS",
    "POLICY_LOSS_FNS",
    "REWARD_MANAGERS",
    "REWARD_SCORERS",
    "get_advantage_fn",
    "get_kl_fn",
    "get_policy_loss_fn",
    "get_reward_manager_cls",
    "get_scorer",
]

ADVANTAGE_FNS: Registry[Callable[..., Any]] = Registry("advantage estimator")
POLICY_LOSS_FNS: Registry[Callable[..., Any]] = Registry("policy loss")
KL_FNS: Registry[Callable[..., Any]] = Registry("KL estimator")
REWARD_MANAGERS: Registry[type] = Registry("reward manager")


def get_advantage_fn(name: str) -> Callable[..., Any]:
    """Advantage estimator by name: gae (alias ppo), grpo, rloo, reinforce_plus_plus, remax, opo."""
    return ADVANTAGE_FNS.get(name)


def get_policy_loss_fn(name: str) -> Callable[..., Any]:
    """Policy loss by name; every one has the signature
    ``(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config) -> (loss, metrics)``."""
    return POLICY_LOSS_FNS.get(name)


def get_kl_fn(name: str) -> Callable[..., Any]:
    """Per-token KL estimator ``(logprob, ref_logprob) -> (bs, response_length)`` by name."""
    return KL_FNS.get(name)


def get_reward_manager_cls(name: str) -> type:
    """Reward manager class by name: naive, dapo."""
    return REWARD_MANAGERS.get(name)
