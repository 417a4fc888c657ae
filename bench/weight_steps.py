"""A simulated optimizer step for the weight-sync benches (`weight_sync.py`, `scale.py`): weights that
change each version by a realistic amount, so a delta pull (`services/weight_sync/wire/delta.py`)
carries what a real run's would, not an empty diff.

The model: every float weight moves by w += w * s * N(0, 1), as an optimizer step touches every
weight. In fp32 nearly every word then changes (low mantissa bits); a bf16 word changes when the
weight crosses a rounding boundary, with probability ~ E|s N| * |w| / ulp ~ s * 0.8 * 185 (|w| / ulp
runs from 128 to 256 across a binade), so `step_size_for(change)` = change / 148 gives about `change`
of the bf16 words while it is small (it saturates towards 1: 0.5 gives ~0.47). BF16_CHANGE is the fraction measured on the quickstart (`examples/quickstart.yaml`, tiny
model, lr 1e-3, `sync_method: memory_bf16`): the median over its GRPO steps of the synchronizer's
"weight delta" log lines (`changed_fraction`: median 0.51 over its 218 deltas, from 0.97 at the
first steps to 0.11-0.17 as the cosine schedule lowers the lr); see docs/weight-sync.md.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

BF16_CHANGE = 0.51


def step_size_for(change: float) -> float:
    """The relative step s that changes about `change` (0..1) of the bf16 words."""
    return min(max(change, 0.0), 0.99) / 148


def train_step(params: Iterable[torch.Tensor], step_size: float, gen: torch.Generator) -> tuple[float, float]:
    """Move every float tensor in place; returns the fractions of fp32 and of bf16 words that changed."""
    changed32 = changed16 = total = 0
    with torch.no_grad():
        for p in params:
            if not p.is_floating_point() or not p.numel():
                continue
            before32, before16 = p.detach().clone(), p.detach().to(torch.bfloat16)
            p.add_(p * step_size * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            changed32 += int((p != before32).sum())
            changed16 += int((p.to(torch.bfloat16).view(torch.int16) != before16.view(torch.int16)).sum())
            total += p.numel()
    return (changed32 / total, changed16 / total) if total else (0.0, 0.0)
