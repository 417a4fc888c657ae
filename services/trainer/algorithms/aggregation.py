"""Loss aggregation: turn a per-token loss matrix into the scalar that is back-propagated.

The mode decides how tokens and sequences are weighted, which changes the algorithm (DAPO's
"token-level loss" is ``token-mean``; Dr.GRPO's constant normaliser is ``seq-mean-token-sum-norm``).
Formulas and the optional global-batch arguments follow veRL ``core_algos.agg_loss``.
"""

from __future__ import annotations

import torch

from .masked import masked_sum

__all__ = ["LOSS_AGG_MODES", "agg_loss", "check_loss_agg_mode"]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def check_loss_agg_mode(loss_agg_mode: str) -> str:
    """Return ``loss_agg_mode`` or raise ``ValueError`` listing the valid modes."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"invalid loss_agg_mode {loss_agg_mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}"
        )
    return loss_agg_mode


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | float | None = None,
    global_batch_size: int | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat`` ``(bs, response_length)`` over ``loss_mask`` into a scalar.

    With L the loss, m the mask, N_tok = ``batch_num_tokens`` or Σm, and S the non-empty sequences:

    - ``token-mean``:              Σ(L·m) / N_tok · dp_size
    - ``seq-mean-token-sum``:      Σ_{i∈S} Σ_t L·m / (``global_batch_size`` or |S|) · dp_size
    - ``seq-mean-token-mean``:     Σ_{i∈S} (Σ_t L·m / Σ_t m) / (``global_batch_size`` or |S|) · dp_size
    - ``seq-mean-token-sum-norm``: Σ(L·m) / (``loss_scale_factor`` or response_length)  (Dr.GRPO,
      https://arxiv.org/abs/2503.20783)

    An empty mask gives 0 (never NaN).  The result is float32 (float64 for float64 input).
    """
    check_loss_agg_mode(loss_agg_mode)
    if loss_agg_mode == "token-mean":
        total = masked_sum(loss_mat, loss_mask)
        n_tok = (
            loss_mask.sum().to(total.dtype)
            if batch_num_tokens is None
            else total.new_tensor(batch_num_tokens)
        )
        return total / n_tok.clamp(min=1e-8) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return masked_sum(loss_mat, loss_mask) / scale
    seq_sums = masked_sum(loss_mat, loss_mask, dim=-1)
    seq_tokens = loss_mask.sum(dim=-1).to(seq_sums.dtype)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_sums / seq_tokens.clamp(min=1e-8)
    else:
        seq_losses = seq_sums
    non_empty = seq_tokens > 0
    n_seq = (
        non_empty.sum().to(seq_sums.dtype)
        if global_batch_size is None
        else seq_sums.new_tensor(global_batch_size)
    )
    return (seq_losses * non_empty).sum() / n_seq.clamp(min=1) * dp_size
