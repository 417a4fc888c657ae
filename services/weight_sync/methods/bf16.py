"""`memory_bf16`: the memory method with floating-point weights sent as bfloat16 (half the bytes of fp32).

The same as `memory` with `synchronizer.wire_dtype: bfloat16`, which gives every method a bf16 wire
(`SyncMethod.with_wire`); this name stays for configs that use it. The trainer keeps fp32 master
weights; rollouts on GPUs run in bf16 anyway (veRL and Trinity-RFT hand vLLM bf16 weights), so only
the rounding the engine would apply moves to the sender. Tensors that are not fp32/fp64 (already half
precision, integer buffers) go as they are. Explorers pull and load exactly as with `memory`:
`load_weights` casts each tensor to the engine parameter's dtype, so an fp32 engine runs on the
bf16-rounded weights (relative error <= 2^-8 per element).
"""

from __future__ import annotations

from services.weight_sync.method import BF16, register_method
from services.weight_sync.methods.builtin import MemoryMethod

__all__ = ["Bf16WireMethod"]


@register_method
class Bf16WireMethod(MemoryMethod):
    name = "memory_bf16"
    wire = BF16
