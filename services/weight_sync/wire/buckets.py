"""Bucket plan for broadcasting a state dict as a few large flat buffers instead of one call per tensor.

Both ends derive the same plan from the same `TensorSpec` list, so no per-bucket metadata travels.
A bucket is a `uint8` buffer: every tensor is packed as its raw bytes at an offset aligned to
`ALIGN` bytes, and the receiver unpacks by viewing the slice back as `(dtype, shape)`, with no copy
and no rounding, so the result is bit-identical. Viewing bytes rather than concatenating typed
tensors lets one bucket carry fp32 norms beside bf16 matrices (each tensor keeps its dtype) while
tensors stay in spec order, which is the order receivers hand them to the model loader.

Rules: tensors are taken in spec order and packed until the next one would overflow `bucket_bytes`;
a tensor larger than a bucket goes alone in a `solo` bucket, sent straight from its own storage
(no packing copy on the sender).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.weight_sync.wire.specs import TensorSpec

ALIGN = 64  # bytes; a multiple of every dtype's itemsize, and cache-line friendly


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives inside a bucket: its position in the spec list and its byte offset."""

    index: int
    offset: int
    spec: TensorSpec


@dataclass(frozen=True)
class Bucket:
    slots: tuple[Slot, ...]
    nbytes: int
    solo: bool = False


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[Bucket]:
    """Split `specs` (in order) into buckets of at most `bucket_bytes` bytes (solo buckets excepted)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    used = 0

    def flush() -> None:
        nonlocal slots, used
        if slots:
            end = max(s.offset + s.spec.nbytes for s in slots)
            buckets.append(Bucket(tuple(slots), end))
        slots, used = [], 0

    for i, spec in enumerate(specs):
        if spec.nbytes > bucket_bytes:
            flush()
            buckets.append(Bucket((Slot(i, 0, spec),), spec.nbytes, solo=True))
            continue
        offset = _align(used)
        if offset + spec.nbytes > bucket_bytes:
            flush()
            offset = 0
        slots.append(Slot(i, offset, spec))
        used = offset + spec.nbytes
    flush()
    return buckets


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat `uint8` view of a tensor's data (made contiguous first if needed)."""
    t = tensor.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def pack(bucket: Bucket, tensors: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy `tensors` (one per slot, in slot order) into the `uint8` buffer `out`; returns the used part.

    A solo bucket is not copied: the tensor's own bytes are returned.
    """
    if bucket.solo:
        return as_bytes(tensors[0])
    flat = out[: bucket.nbytes]
    for slot, tensor in zip(bucket.slots, tensors, strict=True):
        flat[slot.offset : slot.offset + slot.spec.nbytes].copy_(as_bytes(tensor))
    return flat


def unpack(bucket: Bucket, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """`(name, tensor)` views into the received `uint8` buffer, in slot order (no copy)."""
    out = []
    for slot in bucket.slots:
        spec = slot.spec
        raw = flat[slot.offset : slot.offset + spec.nbytes]
        out.append((spec.name, raw.view(spec.dtype).view(spec.shape)))
    return out
