"""FSDP2 wrapping and the few distributed-tensor utilities the trainer needs.

`shard_model` applies `fully_shard` to every decoder layer and then to the root (the layout
veRL and torchtitan use), with bf16 parameters / fp32 gradient reduction on CUDA and plain fp32 on
CPU.  With several ranks or on CUDA a model is built as a meta-device skeleton
(`meta_parameters`), sharded, and only then given memory (`materialize`: each rank allocates its
own shards and rank 0 broadcasts the weights it loaded on the CPU), so no device ever holds a full
copy.  Full state dicts are gathered one parameter at a time (`weight_gather`), keyed by HF
parameter names.

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from services.trainer.distributed import DistInfo

__all__ = [
    "accumulate",
    "clip_grad_norm",
    "decoder_layers",
    "full_state_dict",
    "load_full_state_dict",
    "materialize",
    "meta_parameters",
    "reshard_after_inference",
    "shard_model",
    "uses_fsdp",
]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF model (`model.layers`, `transformer.h`, ...), also under a peft
    LoRA wrapper (`base_model.model.model.layers`; LoRA wraps before sharding: a one-rank bf16 FSDP2 LoRA
    step ran on an H200, tests/integration/trainer/test_trainer_cuda.py)."""
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
    offload: bool = False,
) -> nn.Module:
    """`fully_shard` each decoder layer, then the root; returns the same (now FSDP) module.

    `fsdp` None means `uses_fsdp(info)`; when False the module is returned unwrapped.
    `reshard_after_forward` (of the decoder layers; never the root, see below) defaults to True only
    with several ranks or `offload`: with one rank resharding saves no memory and would repeat the
    parameter all-gather in backward.  `offload`
    (veRL's `fsdp_config.param_offload`) keeps the sharded parameters, their gradients and so the
    optimizer step on the CPU (FSDP2's `CPUOffloadPolicy`); each layer's parameters come to the
    device only for its forward and backward.  On a meta-device skeleton (`meta_parameters`) this
    only lays out the shards; `materialize` then allocates and fills them.
    """
    if not (uses_fsdp(info) if fsdp is None else fsdp):
        return model
    if reshard_after_forward is None:
        reshard_after_forward = info.world_size > 1 or offload
    mesh = init_device_mesh(info.device.type, (info.world_size,))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if info.device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    placement = CPUOffloadPolicy(pin_memory=info.device.type == "cuda") if offload else OffloadPolicy()
    kwargs = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": reshard_after_forward}
    for layer in decoder_layers(model):
        fully_shard(layer, offload_policy=placement, **kwargs)
    # the root (embeddings, final norm, LM head) stays gathered from its forward to the end of the
    # backward, FSDP2's own default for a root: the backward needs the LM head first, and the chunked
    # LM head (`chunked_logprobs`) runs on it after the root's forward has returned
    fully_shard(model, offload_policy=placement, **(kwargs | {"reshard_after_forward": False}))
    return model


@contextmanager
def meta_parameters() -> Iterator[None]:
    """Build modules with their parameters on the meta device (no memory, no values) and their
    buffers real: a model skeleton that `shard_model` lays out and `materialize` fills.

    Buffers stay real because many are not in the state dict (rotary `inv_freq`, computed from the
    config at construction), so no checkpoint could fill them later.  Parameters created through
    `register_parameter` (every `nn.Module` attribute assignment) land on meta; tied parameters stay
    one object, so a tie made at construction survives."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            kwargs = dict(param.__dict__, requires_grad=param.requires_grad)
            module._parameters[name] = type(param)(param.to("meta"), **kwargs)  # type: ignore[assignment]

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def materialize(
    model: nn.Module, info: DistInfo, state: dict[str, torch.Tensor], *, offload: bool = False
) -> None:
    """Allocate the shards of a sharded skeleton and fill them from `state`, the full state dict on
    rank 0 (on CPU; other ranks pass an empty dict); collective.

    Each rank allocates only its own shards (on the CPU when `offload`), and rank 0 broadcasts one
    tensor at a time, so no rank ever holds the full model on the device.  The skeleton's buffers
    (computed at construction) are kept, on the device; persistent ones are overwritten by `state`."""
    home = torch.device("cpu") if offload else info.device
    buffers = dict(model.named_buffers())
    model.to_empty(device=home)
    for name, buffer in buffers.items():  # every tensor on `home`: the load below wants one device
        _set_buffer(model, name, buffer.to(home))
    set_model_state_dict(
        model,
        state if info.is_main else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    if offload:  # offloading moves parameters only; buffers are used where the layers compute
        for name, buffer in list(model.named_buffers()):
            _set_buffer(model, name, buffer.to(info.device))


def _set_buffer(model: nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    model.get_submodule(owner)._buffers[leaf] = value


_T = TypeVar("_T")


def accumulate(module: nn.Module, micro_batches: Sequence[_T], defer_sync: bool) -> Iterator[_T]:
    """The micro-batches of one optimizer step; with `defer_sync` on an FSDP2 module, the backward
    passes of all but the last keep their gradients unreduced (`set_requires_gradient_sync(False)`,
    FSDP1's `no_sync`) and the last one reduce-scatters the sum once.

    The same gradients with one reduce-scatter per parameter group per step instead of one per
    micro-batch; the price is memory: until the last backward each rank holds the full unsharded
    gradient (fp32) of every trainable parameter, not its 1/N shard (`trainer.defer_grad_sync`;
    the memory plan counts it).  Sync is on again when the loop ends, however it ends.
    """
    fsdp = defer_sync and isinstance(module, FSDPModule)
    try:
        for k, micro in enumerate(micro_batches):
            if fsdp:
                module.set_requires_gradient_sync(k == len(micro_batches) - 1)  # type: ignore[operator]
            yield micro
    finally:
        if fsdp:
            module.set_requires_gradient_sync(True)  # type: ignore[operator]


def reshard_after_inference(module: nn.Module) -> None:
    """Free the parameters a no-grad forward left unsharded.

    FSDP2 keeps the root's parameters unsharded after forward (backward needs them next).  After a
    forward under `torch.no_grad` no backward comes, and the next training forward would reuse the
    unsharded parameters, so its gradients would never be reduced into the sharded `.grad` (they
    are silently lost).  Every no-grad pass (old/ref log-probs, values) ends with this call.
    """
    if isinstance(module, FSDPModule):
        module.reshard()


def full_state_dict(
    model: nn.Module, dtype: torch.dtype | None = None, device: str | torch.device | None = "cpu"
) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on `device` (None: the training device), on rank 0 (other
    ranks get an empty dict); floating tensors in `dtype` (None: as trained).

    Collective: every rank must call it.  Tensors are private copies (safe to write in a thread),
    gathered one parameter at a time with one copy each (`weight_gather.iter_full_tensors`).
    """
    from services.trainer.weight_gather import gather_full  # weight_gather is the one implementation

    return gather_full(model, dtype=dtype, device=device)


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
