"""FSDP2 wrapping and the few distributed-tensor utilities the trainer needs.

`shard_model` applies `fully_shard` to every decoder layer and then to the root (the layout
veRL and torchtitan use), with bf16 parameters / fp32 gradient reduction on CUDA and plain fp32 on
CPU.  Full state dicts are gathered with `get_model_state_dict(full_state_dict=True,
cpu_offload=True)`, keyed by HF parameter names.

Only the wrapping is conditional (`uses_fsdp`): with several ranks, or on CUDA (where FSDP2's
policy gives the bf16 compute), the module is sharded; a single CPU process has nothing to shard,
and FSDP2 would still copy every parameter into and out of its flat all-gather buffers on each
forward and backward (about a third of a step on a small model), so there the plain module is
used.  Everything else — actor, critic, optimizer, gradient clipping, checkpoints, state dicts —
is one code path: the helpers below accept both plain and sharded modules (plain tensors are the
one-rank case of `DTensor` shards), and `tests/unit/trainer` checks that a forced one-rank FSDP2
step equals the plain one.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from services.trainer.distributed import DistInfo

__all__ = [
    "clip_grad_norm",
    "decoder_layers",
    "full_state_dict",
    "load_full_state_dict",
    "reshard_after_inference",
    "shard_model",
    "uses_fsdp",
]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF model (`model.layers`, `transformer.h`, ...), also under a peft
    LoRA wrapper (`base_model.model.model.layers`; LoRA wraps before sharding, untested on GPU)."""
    paths = ("model.layers", "layers", "transformer.h", "gpt_neox.layers", "backbone.layers")
    for path in (*paths, *(f"base_model.model.{p}" for p in paths)):
        obj: object = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList):
            return list(obj)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


def uses_fsdp(info: DistInfo) -> bool:
    """Whether `shard_model` wraps: with several ranks or on CUDA (see the module docstring)."""
    return info.world_size > 1 or info.device.type == "cuda"


def shard_model(
    model: nn.Module,
    info: DistInfo,
    *,
    fsdp: bool | None = None,
    reshard_after_forward: bool | None = None,
) -> nn.Module:
    """`fully_shard` each decoder layer, then the root; returns the same (now FSDP) module.

    `fsdp` None means `uses_fsdp(info)`; when False the module is returned unwrapped.
    `reshard_after_forward` defaults to True only with several ranks: with one rank resharding
    saves no memory and would repeat the parameter all-gather in backward.
    """
    if not (uses_fsdp(info) if fsdp is None else fsdp):
        return model
    if reshard_after_forward is None:
        reshard_after_forward = info.world_size > 1
    mesh = init_device_mesh(info.device.type, (info.world_size,))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if info.device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


def reshard_after_inference(module: nn.Module) -> None:
    """Free the parameters a no-grad forward left unsharded.

    FSDP2 keeps the root's parameters unsharded after forward (backward needs them next).  After a
    forward under `torch.no_grad` no backward comes, and the next training forward would reuse the
    unsharded parameters, so its gradients would never be reduced into the sharded `.grad` (they
    are silently lost).  Every no-grad pass (old/ref log-probs, values) ends with this call.
    """
    if isinstance(module, FSDPModule):
        module.reshard()


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on CPU, on rank 0 (other ranks get an empty dict).

    Collective: every rank must call it.  Tensors are private copies (safe to write in a thread).
    """
    if not any(isinstance(p, DTensor) for p in model.parameters()):
        # a plain module (one process): its own state dict, without the distributed API's walk over
        # every submodule (a few ms per call on a small model, paid at every weight sync)
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().clone() for k, v in sd.items()}


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load a full state dict (given on rank 0) into the sharded model; collective.  `strict` False:
    `state` may hold a subset (a LoRA checkpoint's adapter)."""
    set_model_state_dict(
        model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
    )


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """Clip by the global L2 norm over every shard; returns the norm before clipping (may be inf/nan).

    When the norm is not finite nothing is scaled (the caller skips the step).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    sq = torch.stack([torch.linalg.vector_norm(g.float(), 2.0) ** 2 for g in local]).sum()
    if dist.is_initialized() and dist.get_world_size() > 1 and isinstance(grads[0], DTensor):
        dist.all_reduce(sq)
    norm = float(sq.sqrt())
    if math.isfinite(norm) and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in local:
            g.mul_(scale)
    return norm
