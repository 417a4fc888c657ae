"""Tensor metadata for weight sync: what a receiver must know before any byte arrives.

A `TensorSpec` is the (name, dtype, shape) of one entry of a state dict. The trainer builds the list
once (`specs_of(state_dict)`), the synchronizer hands it to every receiver inside
`rft.v1.WeightSyncGroupInfo.tensors` (`rft.v1.TensorMeta`), and both ends derive the same bucket
plan from it (`buckets.py`). The list order is the transfer order and the order receivers yield
tensors in. `fingerprint(specs)` is a cheap 63-bit digest both ends compare so that a member with
different metadata fails loudly instead of mis-reading bytes. `weights_digest(named)` is a SHA-256 of
names, dtypes, shapes and bytes (sorted by name): equal digests mean bit-identical weights.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from rft.v1 import common_pb2

_TO_PROTO: dict[torch.dtype, int] = {
    torch.float32: common_pb2.DTYPE_FLOAT32,
    torch.float16: common_pb2.DTYPE_FLOAT16,
    torch.bfloat16: common_pb2.DTYPE_BFLOAT16,
    torch.float64: common_pb2.DTYPE_FLOAT64,
    torch.int64: common_pb2.DTYPE_INT64,
    torch.int32: common_pb2.DTYPE_INT32,
    torch.int8: common_pb2.DTYPE_INT8,
    torch.uint8: common_pb2.DTYPE_UINT8,
    torch.bool: common_pb2.DTYPE_BOOL,
}
_FROM_PROTO: dict[int, torch.dtype] = {v: k for k, v in _TO_PROTO.items()}
_DTYPE_NAMES: dict[torch.dtype, str] = {d: str(d).removeprefix("torch.") for d in _TO_PROTO}


def dtype_to_proto(dtype: torch.dtype) -> int:
    """`torch.bfloat16` -> `rft.v1.DTYPE_BFLOAT16`; unsupported dtypes raise `ValueError`."""
    try:
        return _TO_PROTO[dtype]
    except KeyError:
        known = ", ".join(_DTYPE_NAMES.values())
        raise ValueError(f"dtype {dtype} cannot cross a boundary; supported: {known}") from None


def dtype_from_proto(value: int) -> torch.dtype:
    try:
        return _FROM_PROTO[value]
    except KeyError:
        raise ValueError(f"proto DType {value} is not a supported tensor dtype") from None


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one tensor; mirrors `rft.v1.TensorMeta` 1:1."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        dtype_to_proto(self.dtype)  # refuse dtypes the proto cannot name
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s < 0 for s in self.shape):
            raise ValueError(f"tensor {self.name!r}: negative dimension in shape {self.shape}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name, tensor.dtype, tuple(tensor.shape))

    def matches(self, tensor: torch.Tensor) -> bool:
        return tensor.dtype == self.dtype and tuple(tensor.shape) == self.shape

    def to_proto(self) -> common_pb2.TensorMeta:
        return common_pb2.TensorMeta(name=self.name, dtype=dtype_to_proto(self.dtype), shape=self.shape)

    @classmethod
    def from_proto(cls, meta: common_pb2.TensorMeta) -> TensorSpec:
        return cls(meta.name, dtype_from_proto(meta.dtype), tuple(meta.shape))

    def __str__(self) -> str:
        return f"{self.name}:{_DTYPE_NAMES[self.dtype]}{list(self.shape)}"


def specs_of(
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> list[TensorSpec]:
    """Specs of a state dict (or `(name, tensor)` pairs), in its order. Duplicate names raise."""
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    specs, seen = [], set()
    for name, tensor in items:
        if name in seen:
            raise ValueError(f"tensor name {name!r} appears twice")
        seen.add(name)
        specs.append(TensorSpec.of(name, tensor))
    return specs


def specs_to_proto(specs: Iterable[TensorSpec]) -> list[common_pb2.TensorMeta]:
    return [s.to_proto() for s in specs]


def specs_from_proto(metas: Iterable[common_pb2.TensorMeta]) -> list[TensorSpec]:
    return [TensorSpec.from_proto(m) for m in metas]


def fingerprint(specs: Sequence[TensorSpec]) -> int:
    """A stable 63-bit digest of the spec list (fits a signed int64 tensor element)."""
    h = hashlib.blake2b(digest_size=8)
    for s in specs:
        h.update(str(s).encode())
        h.update(b"\0")
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def weights_digest(named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 (hex) over (name, dtype, shape, bytes) of every tensor, in name order."""
    items = sorted(named.items() if isinstance(named, Mapping) else named, key=lambda kv: kv[0])
    h = hashlib.sha256()
    for name, t in items:
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
