"""Gathering the trainer's full weights for weight sync: one parameter at a time, in the wire dtype.

FSDP2 holds each parameter as a `DTensor` shard. The distributed state-dict API
(`get_model_state_dict(full_state_dict=True, cpu_offload=True)`) gathers every parameter to host
memory in the master dtype (fp32), and a private copy of that doubled it: for a 7B model about
56 GB of host memory per sync, and for the `nccl` method the weights then went back to the GPU and
over the wire in fp32, twice the bytes the explorer's bf16 engine needs.

`iter_full_tensors` gathers instead with `DTensor.full_tensor()` per parameter (an all-gather over
the trainer's ranks), in `model.state_dict()` order, which is the same on every rank, so every rank
issues the same collectives in the same order. Each full tensor is cast on the training device to
the wire dtype and then either left there (`device=None`: the `nccl` method broadcasts it straight
from GPU memory, bucket by bucket, with no host copy) or copied once to `device` (the host-memory
methods `memory` and `checkpoint`: one host copy in the wire dtype, no copy of a copy). Only the
current parameter's full tensor exists besides what the caller keeps.

The wire dtype is the training compute dtype (`compute_dtype`): the FSDP2 `MixedPrecisionPolicy`
`param_dtype` (bf16 when the trainer computes in bf16 on CUDA, docs/weight-sync.md: "the wire dtype
is a property of every method"), else the parameters' own dtype, so CPU runs (fp32, no mixed precision) keep
bit-identical weights. Only floating tensors are cast; integer buffers travel as they are.
Receivers cast whatever arrives into their model's dtype (`services.weight_sync.wire.loading.load_weights`).

`gather_kind` / `parse_kind` name what the engine's `iter_state_dict(kind)` gathers: `full` (host,
wire dtype), `full@device` (left on the training device, wire dtype; the `nccl` method) and
`adapter` (a LoRA adapter, host).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = [
    "ADAPTER",
    "FULL",
    "FULL_ON_DEVICE",
    "cast_state",
    "compute_dtype",
    "gather_full",
    "iter_full_tensors",
    "parse_kind",
]

FULL, FULL_ON_DEVICE, ADAPTER = "full", "full@device", "adapter"
_WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def parse_kind(kind: object) -> tuple[str, bool]:
    """`(what, on_device)` of an `iter_state_dict` kind: what is `full` or `adapter`."""
    if kind in (None, FULL):
        return FULL, False
    if kind == FULL_ON_DEVICE:
        return FULL, True
    if kind == ADAPTER:
        return ADAPTER, False
    raise ValueError(f"state-dict kind {kind!r} is not one of {FULL}, {FULL_ON_DEVICE}, {ADAPTER}")


def compute_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype the model computes in: FSDP2's `MixedPrecisionPolicy.param_dtype` when the root
    is sharded with one, else None (each tensor keeps its own dtype)."""
    get_state = getattr(model, "_get_fsdp_state", None)  # FSDPModule; no public accessor exists
    if get_state is None:
        return None
    policy = getattr(get_state(), "_mp_policy", None)
    return getattr(policy, "param_dtype", None)


def _clean(name: str) -> str:
    for wrapper in _WRAPPERS:
        name = name.replace(wrapper, "")
    return name


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def iter_full_tensors(
    model: nn.Module,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    rank0_only: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, full tensor)` for every state-dict entry of `model` (plain or FSDP2), in order.

    Collective when the model is sharded: every rank must consume the whole iterator. `dtype`: the
    dtype of floating tensors (None: as they are); `device`: where the result goes (None: the
    training device). With `rank0_only` the other ranks take part in the gathers but get nothing.
    Each yielded tensor is private (never a view of a parameter), so it may be read while training
    goes on; a name that shares its tensor with an earlier one (tied embeddings) gets its own copy.
    """
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    keep = rank == 0 or not rank0_only
    target = torch.device(device) if device is not None else None
    state = model.state_dict(keep_vars=True)
    tied = {i for i, n in Counter(id(v) for v in state.values()).items() if n > 1}
    seen: dict[int, torch.Tensor] = {}  # tied tensors only: a streaming caller keeps nothing else alive
    for name, value in state.items():
        if id(value) in seen:  # a tied weight: the same tensor under another name
            if keep:
                yield _clean(name), seen[id(value)].clone()
            continue
        source = value.detach()
        local = source.to_local() if isinstance(source, DTensor) else source
        full = source.full_tensor() if isinstance(source, DTensor) else source
        if not keep:
            del full
            if id(value) in tied:
                seen[id(value)] = local  # placeholder; never yielded on this rank
            continue
        if dtype is not None and full.is_floating_point() and full.dtype != dtype:
            full = full.to(dtype)  # on the training device: the host sees only the wire dtype
        if target is not None and full.device != target:
            full = full.to(target)
        if _shares_storage(full, local):
            full = full.clone()
        if id(value) in tied:
            seen[id(value)] = full
        yield _clean(name), full


def gather_full(
    model: nn.Module, *, dtype: torch.dtype | None = None, device: str | torch.device | None = "cpu"
) -> dict[str, torch.Tensor]:
    """`iter_full_tensors` collected into a dict on rank 0 (other ranks get an empty dict)."""
    return dict(iter_full_tensors(model, dtype=dtype, device=device))


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """`state` with its floating tensors cast to `dtype`, one tensor at a time (each original is
    dropped as soon as its cast exists, so two full copies never coexist)."""
    if dtype is None:
        return state
    for name in list(state):
        t = state[name]
        if t.is_floating_point() and t.dtype != dtype:
            state[name] = t.to(dtype)
    return state
