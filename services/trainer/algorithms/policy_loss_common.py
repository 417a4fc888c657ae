"""The shared calling convention of policy losses and the decorator that registers them.

Every policy loss is called as
``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None)``
and returns ``(loss, metrics)``.  ``config`` is the loss's own frozen params class, a plain dict
(checked by ``from_dict``) or ``None`` for the defaults; the decorator converts it once, so the
loss bodies only see typed params.  ``rollout_is_weights`` ``(bs, response_length)``, when given,
multiply the per-token loss (veRL's rollout importance-sampling correction).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .aggregation import check_loss_agg_mode
from .params import FrozenParams
from .registries import POLICY_LOSS_FNS

__all__ = ["PolicyLossFn", "register_policy_loss", "weighted"]

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def register_policy_loss(
    name: str,
    *aliases: str,
    config_cls: type[FrozenParams],
    reads_reference: bool = False,
    pairwise: bool = False,
):
    """Register a policy loss under ``name``/``aliases`` with its params class ``config_cls``.

    The registered function exposes ``config_cls`` so presets can validate ``policy_loss_fn_args``,
    ``reads_reference`` (its first argument is the frozen reference model's log-probs instead of the
    old policy's, so the trainer loads a reference model) and ``pairwise`` (rows come as adjacent
    (chosen, rejected) pairs that every batch split keeps together).
    """

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        @functools.wraps(fn)
        def wrapper(
            old_log_prob: torch.Tensor | None,
            log_prob: torch.Tensor,
            advantages: torch.Tensor | None,
            response_mask: torch.Tensor,
            loss_agg_mode: str = "token-mean",
            config: Any = None,
            rollout_is_weights: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, dict[str, float]]:
            check_loss_agg_mode(loss_agg_mode)
            params = config_cls.coerce(config)
            return fn(
                old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, params, rollout_is_weights
            )

        wrapper.config_cls = config_cls  # type: ignore[attr-defined]
        wrapper.reads_reference = reads_reference  # type: ignore[attr-defined]
        wrapper.pairwise = pairwise  # type: ignore[attr-defined]
        POLICY_LOSS_FNS.add(name, wrapper, *aliases)
        return wrapper

    return decorator


def weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Per-token loss × rollout IS weights (detached), or unchanged when there are none."""
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights.detach()
