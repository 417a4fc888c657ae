"""KL divergence estimators between the policy and the reference policy, per token.

Used in two places, as in veRL (docs/algorithms.md, "KL"): as a reward penalty (``apply_kl_penalty``,
usually ``kl``/k1 on the rollout log-probs) and as a loss term (``compute_kl_loss``, usually
``low_var_kl``/k3).
The estimators are Schulman's k1/k2/k3 (http://joschu.net/blog/kl-approx.html).  The ``+``
variants are straight-through: the forward value of the named estimator, the gradient of k2,
which is the unbiased gradient of KL(π‖π_ref) for samples from π (unlike veRL at b178a3c,
where ``k3+`` raises ``NotImplementedError``).

The reward penalty's coefficient β comes from a KL controller chosen by name
(``kl_penalty_fn_args.kl_ctrl``): ``fixed`` or ``adaptive`` (Ziegler et al. 2019), updated once per
step from the measured KL and saved in checkpoints by the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from services.common.registry import Registry

from .aggregation import agg_loss
from .masked import masked_mean
from .params import unknown_key_error
from .registries import KL_FNS, get_kl_fn

__all__ = [
    "KL_CONTROLLERS",
    "KL_CTRL_ARGS",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "apply_kl_penalty",
    "compute_kl_loss",
    "kl_penalty",
    "kl_penalty_forward",
    "make_kl_controller",
]


@KL_FNS.register("kl", "k1")
def kl_k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k1 = log π − log π_ref.  Shapes ``(bs, response_length)``."""
    return logprob - ref_logprob


@KL_FNS.register("abs")
def kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """|log π − log π_ref|.  Shapes ``(bs, response_length)``."""
    return (logprob - ref_logprob).abs()


@KL_FNS.register("mse", "k2")
def kl_k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π − log π_ref)².  Shapes ``(bs, response_length)``."""
    return 0.5 * (logprob - ref_logprob).square()


@KL_FNS.register("low_var_kl", "k3")
def kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k3 = exp(x) − x − 1 with x = clamp(log π_ref − log π, ±20), result clamped to [0, 10].

    Unbiased for KL(π‖π_ref) under samples of π, low variance, and never negative: it is computed
    as expm1(x) − x, which avoids the cancellation that makes veRL's exp(x) − x − 1 slightly
    negative near x = 0 (veRL clamps to [−10, 10]; the values agree to ~1e-7).
    Shapes ``(bs, response_length)``.
    """
    x = (ref_logprob - logprob).clamp(-20.0, 20.0)
    return (torch.expm1(x) - x).clamp(0.0, 10.0)


@KL_FNS.register("none")
def kl_none(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """No KL: zeros ``(bs, response_length)`` (keeps the graph so ``.backward()`` still works)."""
    return logprob * 0.0


def _straight_through(forward_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    def kl_straight_through(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        k2 = kl_k2(logprob, ref_logprob)
        return k2 - k2.detach() + forward_fn(logprob, ref_logprob).detach()

    kl_straight_through.__doc__ = (
        f"Straight-through: value of ``{forward_fn.__name__}``, gradient of k2 = (log π − log π_ref)."
    )
    return kl_straight_through


for _base, _aliases in (("kl", ("k1",)), ("abs", ()), ("low_var_kl", ("k3",))):
    KL_FNS.add(_base + "+", _straight_through(KL_FNS.get(_base)), *(a + "+" for a in _aliases))


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Value of the named estimator (without the straight-through gradient trick)."""
    return get_kl_fn(kl_penalty.removesuffix("+"))(logprob, ref_logprob)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate ``(bs, response_length)`` named by ``kl_penalty``.

    ``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``, ``none``, and the
    straight-through ``k1+``/``kl+``, ``k3+``/``low_var_kl+``, ``abs+``.
    """
    return get_kl_fn(kl_penalty)(logprob, ref_logprob)


def compute_kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL loss term agg(kl(log π, log π_ref)) (veRL ``actor.use_kl_loss``).

    The caller adds ``kl_loss_coef`` × this loss (coefficient 0.001 in veRL and Trinity-RFT).
    Shapes: inputs ``(bs, response_length)``; returns a scalar and ``{"actor/kl_loss": …}``.
    """
    kld = kl_penalty(log_prob, ref_log_prob, kl_loss_type)
    loss = agg_loss(kld, response_mask, loss_agg_mode)
    return loss, {"actor/kl_loss": float(loss.detach())}


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Reward shaping: rewards = scores − β·kl(old, ref)·m  (veRL ``use_kl_in_reward``).

    ``actor/reward_kl_penalty`` is the batch mean of each sequence's masked-mean KL; feed it to a
    KL controller's ``update``.  Shapes ``(bs, response_length)``.
    """
    kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type)
    kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld))
    rewards = token_level_scores - kl_coef * kld
    current_kl = masked_mean(kld, response_mask, dim=-1).mean()
    current_kl = float(current_kl) if kld.shape[0] else 0.0
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(kl_coef)}


KL_CONTROLLERS: Registry[type] = Registry("KL controller (kl_penalty_fn_args.kl_ctrl)")


@KL_CONTROLLERS.register("fixed")
@dataclass
class FixedKLController:
    """Constant KL coefficient β (veRL ``kl_ctrl.type=fixed``, kl_coef 0.001)."""

    value: float = 0.001

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""


@KL_CONTROLLERS.register("adaptive")
@dataclass
class AdaptiveKLController:
    """Adaptive β (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593).

    e = clip(KL/target − 1, −0.2, 0.2); β ← β·(1 + e·n_steps/horizon).
    Defaults as veRL: target 0.1, horizon 10000.
    """

    value: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000

    def __post_init__(self) -> None:
        if not self.target_kl > 0 or not self.horizon > 0:
            raise ValueError(
                f"adaptive KL controller: target_kl ({self.target_kl}) and horizon ({self.horizon}) must be > 0"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β towards keeping the observed KL at ``target_kl``."""
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController
# kl_penalty_fn_args keys (veRL ``algorithm.kl_ctrl.{type,kl_coef,target_kl,horizon}``)
KL_CTRL_ARGS = ("kl_coef", "kl_ctrl", "target_kl", "horizon")


def make_kl_controller(args: Mapping[str, Any]) -> KLController:
    """The reward-KL controller of ``kl_penalty_fn_args``: ``kl_ctrl`` (``fixed`` | ``adaptive``,
    default fixed) starting at ``kl_coef``; ``target_kl`` and ``horizon`` for ``adaptive`` only."""
    for key in args:
        if key not in KL_CTRL_ARGS:
            raise unknown_key_error("kl_penalty_fn_args", key, list(KL_CTRL_ARGS))
    kind = str(args.get("kl_ctrl", "fixed"))
    cls = KL_CONTROLLERS.get(kind)
    extra = {k: args[k] for k in ("target_kl", "horizon") if k in args}
    allowed = {f.name for f in fields(cls)}
    for key in extra:
        if key not in allowed:
            raise ValueError(
                f"kl_penalty_fn_args.{key} applies to kl_ctrl: adaptive only (kl_ctrl is {kind!r})"
            )
    return cls(value=float(args.get("kl_coef", 0.001)), **extra)
