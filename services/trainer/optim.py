"""Optimizer and learning-rate schedule from `algorithm.optimizer` (or the critic's overrides).

AdamW (Trinity-RFT's `adam` means the same: decoupled weight decay), with a linear warm-up
(`lr_warmup_steps`, or `lr_warmup_steps_ratio` x total steps) followed by a constant or cosine
schedule that ends at `min_lr_ratio` x lr — the shapes of veRL's `get_constant_schedule_with_warmup`
and `get_cosine_schedule_with_warmup`.  The schedule advances once per trainer step.

`move_optimizer_state` is veRL's `offload_fsdp_optimizer` / `load_fsdp_optimizer`
(`fsdp_config.optimizer_offload`): AdamW's two moments are twice the trainable parameters' bytes,
so the trainer keeps them on the CPU between updates and brings them to the device only for one.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from services.trainer.settings import OptimSettings

__all__ = ["build_optimizer", "build_scheduler", "lr_factor", "move_optimizer_state"]


def build_optimizer(model: nn.Module, s: OptimSettings) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters.

    Plain (unsharded) float parameters use the fused kernel: one pass over all parameters instead of
    a dozen foreach ops (on CPU about 3x faster for a small model, where the optimizer step is a
    visible part of the update).  Sharded (DTensor) parameters keep torch's default (foreach)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(
        type(p) is nn.Parameter and p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params
    )
    return torch.optim.AdamW(
        params, lr=s.lr, betas=s.betas, eps=s.eps, weight_decay=s.weight_decay, fused=fused or None
    )


def lr_factor(step: int, s: OptimSettings, total_steps: int | None) -> float:
    """Multiplier of the base lr after `step` scheduler steps."""
    warmup = s.warmup_for(total_steps or 0)
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup  # the first step already moves (veRL's starts at lr 0)
    if s.scheduler == "constant" or not total_steps:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return s.min_lr_ratio + (1.0 - s.min_lr_ratio) * cosine


def build_scheduler(
    optimizer: torch.optim.Optimizer, s: OptimSettings, total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, s, total_steps))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str | None = None) -> int:
    """Move every per-parameter state tensor (AdamW's moments; sharded `DTensor`s too) to `device`,
    or with None to the device of its parameter's (local) values; returns the bytes moved.  Scalars
    (the `step` counter) stay where the optimizer keeps them: on the CPU for the foreach kernel, on
    the device for the fused one.  Values are copied exactly."""
    moved = 0
    for param, state in optimizer.state.items():
        local = param.to_local() if isinstance(param, DTensor) else param
        target = local.device if device is None else torch.device(device)
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != target:
                state[key] = value.to(target)
                moved += value.numel() * value.element_size()
    return moved
