"""`memory_bf16`: the memory method with floating-point weights sent as bfloat16 (half the bytes of fp32).

The trainer keeps fp32 master weights; rollouts on GPUs run in bf16 anyway (veRL and Trinity-RFT
hand vLLM bf16 weights), so only the rounding the engine would apply moves to the sender. Tensors
that are not fp32/fp64 (already half precision, integer buffers) go as they are. Explorers pull and
load exactly as with `memory`: `load_weights` casts each tensor to the engine parameter's dtype, so
an fp32 engine runs on the bf16-rounded weights (relative error <= 2^-8 per element).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from services.common.weight_sync.method import register_method
from services.common.weight_sync.methods import MemoryMethod

__all__ = ["Bf16WireMethod"]

_WIDE = (torch.float32, torch.float64)


@register_method
class Bf16WireMethod(MemoryMethod):
    name = "memory_bf16"

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:  # the wire dtype: bf16 for fp32/fp64
        return torch.bfloat16 if dtype in _WIDE else dtype

    def encode(self, state: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        cast: dict[tuple, torch.Tensor] = {}  # tied weights stay one tensor (the codec sends it once)
        for name, t in state.items():
            if t.dtype not in _WIDE:
                out[name] = t
                continue
            key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
            if key not in cast:
                cast[key] = t.to(torch.bfloat16)
            out[name] = cast[key]
        return out
