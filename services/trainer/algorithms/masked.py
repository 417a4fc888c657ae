"""Masked reductions shared by every algorithm module.

All functions take a value tensor and a mask of the same shape, usually ``(bs, response_length)``
with 1 for a response token and 0 for padding (or a tool/observation token).  Masked positions
never contribute, even when they hold ``inf``/``nan`` (the value is selected with ``torch.where``,
not multiplied), and an all-zero mask gives 0 rather than NaN.  Reductions accumulate in float32
at least, so bf16 inputs stay accurate; results come back in float32 (or float64 for float64).
"""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_sum", "masked_var", "masked_whiten", "reduce_dtype"]


def reduce_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 are promoted)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _prepare(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = reduce_dtype(values)
    m = mask.to(dtype)
    v = torch.where(m != 0, values.to(dtype), torch.zeros((), dtype=dtype, device=values.device))
    return v, m


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values·mask over ``dim`` (all elements when ``None``)."""
    v, m = _prepare(values, mask)
    return (v * m).sum() if dim is None else (v * m).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask over ``dim``; 0 where the mask is empty.

    veRL divides by ``Σ mask + 1e-8``; dividing by ``max(Σ mask, tiny)`` gives the same numbers
    for non-empty masks and exactly 0 for empty ones.
    """
    v, m = _prepare(values, mask)
    total = (v * m).sum() if dim is None else (v * m).sum(dim=dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp(min=1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements (a scalar).

    ``unbiased`` applies Bessel's correction n/(n-1) when n = Σ mask > 1; with n <= 1 the variance
    is 0 (veRL raises instead).
    """
    mean = masked_mean(values, mask)
    v, m = _prepare(values, mask)
    var = masked_mean((v - mean) ** 2, m)
    if unbiased:
        n = m.sum()
        var = torch.where(n > 1, var * n / (n - 1).clamp(min=1e-8), var)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values − mean_m) / sqrt(var_m + 1e-8), statistics over the masked elements.

    As veRL ``masked_whiten`` (unbiased variance); with ``shift_mean=False`` the mean is added
    back.  Masked positions are set to 0 (veRL leaves arbitrary values there).
    Shapes: values, mask ``(bs, response_length)`` -> ``(bs, response_length)``.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    v, m = _prepare(values, mask)
    whitened = (v - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * m
