"""`lora_adapter`: with LoRA, only the adapter goes to the explorers, which merge it into their base weights.

A LoRA run trains A (r x in) and B (out x r) per adapted linear layer and freezes the base weight W,
so the policy is W' = W + scaling * B @ A (Hu et al., 2021, arXiv 2106.09685). Instead of the
merged model (every weight, every sync) the trainer sends, per adapted weight `name` (its base
model name), `name#lora_A`, `name#lora_B`, `name#lora_scaling` (float64, one element) and, for
fan-in-fan-out layers, `name#lora_T`, as memory chunks through the synchronizer (`pushed`). Each
explorer reads the base weights of those names once from its model folder (`model.model_path`: the
base the trainer's adapter sits on) and loads W + (B @ A) * scaling, computed in fp32 and cast back
exactly as the trainer's HF export merges them, so an explorer holds the same bits as the export.
The bytes per sync are the adapter's: for rank r on a d x d layer 2rd instead of d^2.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from services.weight_sync.errors import WeightSyncError
from services.weight_sync.method import Fetch, Load, Receiver, WaitAnswer, register_method
from services.weight_sync.methods.builtin import MemoryMethod

__all__ = ["AdapterFetch", "LoraAdapterMethod", "adapter_targets", "merge_adapter", "read_base_weights"]

A, B, SCALING, TRANSPOSED = "#lora_A", "#lora_B", "#lora_scaling", "#lora_T"


def adapter_targets(adapter: Mapping[str, torch.Tensor]) -> list[str]:
    """The base weight names an adapter state dict adapts."""
    return sorted(k.removesuffix(A) for k in adapter if k.endswith(A))


def merge_adapter(
    base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """{name: W + (B @ A) * scaling} for every adapted `name` (fp32 math, W's dtype)."""
    out = {}
    for name in adapter_targets(adapter):
        if name not in base:
            raise WeightSyncError(f"the adapter adapts {name!r}, which the base model does not have")
        delta = (adapter[name + B].float() @ adapter[name + A].float()) * float(
            adapter[name + SCALING].item()
        )
        if name + TRANSPOSED in adapter:
            delta = delta.T
        w = base[name]
        if tuple(delta.shape) != tuple(w.shape):
            raise WeightSyncError(
                f"{name}: the adapter's update is {tuple(delta.shape)}, the weight {tuple(w.shape)}"
            )
        out[name] = (w.float() + delta).to(w.dtype)
    return out


def read_base_weights(folder: str | Path, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """The tensors `names` from an HF model folder's safetensors files (sharded or not), on CPU."""
    wanted, found = set(names), {}
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightSyncError(f"{folder} has no *.safetensors files to read the base weights from")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in wanted.intersection(f.keys()):
                found[key] = f.get_tensor(key)
    missing = sorted(wanted - set(found))
    if missing:
        raise WeightSyncError(
            f"base weights {missing[:3]}{'...' if len(missing) > 3 else ''} are not in {folder}"
        )
    return found


@register_method
class LoraAdapterMethod(MemoryMethod):
    name = "lora_adapter"
    state_kind = "adapter"

    def fetch(self, client: Any, receiver: Receiver) -> Fetch:
        if not receiver.model_path:
            raise WeightSyncError(
                "the lora_adapter method needs the explorer's model folder (its base weights)"
            )
        return AdapterFetch(client, receiver.load, receiver.model_path)


class AdapterFetch:
    """Pull the adapter, merge it into the base weights (read once, kept), load the merged weights."""

    def __init__(self, client: Any, load: Load, model_path: str | Path):
        self.client, self.load, self.model_path = client, load, model_path
        self.base: dict[str, torch.Tensor] = {}

    async def __call__(self, answer: WaitAnswer) -> int:
        version, adapter = await self.client.pull_weights(0, "cpu")
        names = adapter_targets(adapter)
        if not names:
            raise WeightSyncError(
                "the pulled weights hold no LoRA adapter (is the trainer's sync_method lora_adapter?)"
            )
        missing = [n for n in names if n not in self.base]
        if missing:
            self.base.update(await asyncio.to_thread(read_base_weights, self.model_path, missing))
        merged = await asyncio.to_thread(merge_adapter, self.base, adapter)
        await self.load(merged.items(), int(version.version), strict=False)  # the adapted layers only
        return int(version.version)
