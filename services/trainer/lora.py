"""LoRA on the trainer's policy (`model.lora_configs`, as Trinity-RFT and veRL offer it), with peft.

LoRA (Hu et al., 2021, https://arxiv.org/abs/2106.09685) freezes every base weight W and trains a
low-rank update: a wrapped linear layer computes

    y = x W^T + scaling * (x A^T) B^T,    A: (r, in), B: (out, r), scaling = lora_alpha / r

with B = 0 at the start, so the adapted model begins as the base model.  Only A and B are trained
(the optimizer sees only them); the reference policy of a KL term is the same module with its
adapters disabled (`reference_mode`), as veRL does with LoRA, so no second model is loaded.

The explorer is sent merged weights under the base model's names, W' = W + scaling * B A
(`merged_state_dict`), so it needs no LoRA support; with `sync_method: lora_adapter` only the adapter
is sent (`adapter_state_dict`) and each explorer merges it into its base weights; the HF export writes the same merged model and
the adapter itself in peft's folder layout (`save_adapter`: `adapter_config.json` and
`adapter_model.safetensors`, loadable with `PeftModel.from_pretrained`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file
from torch import nn

if TYPE_CHECKING:  # peft is imported where LoRA is used: importing it costs seconds
    from peft import PeftModel

__all__ = [
    "LoraSettings",
    "adapter_state_dict",
    "apply_lora",
    "is_lora",
    "merged_state_dict",
    "reference_mode",
    "save_adapter",
]

_PREFIX = "base_model.model."


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """The one adapter of a run (from `model.lora_configs[0]`)."""

    name: str = "default"
    path: str = ""  # a saved peft adapter folder to start from; empty: a new adapter
    rank: int = 32
    alpha: int = 32
    target_modules: str | tuple[str, ...] = "all-linear"
    exclude_modules: str | tuple[str, ...] | None = None

    @classmethod
    def from_config(cls, entry: Any) -> LoraSettings:
        def names(v: str | list[str] | None) -> str | tuple[str, ...] | None:
            return tuple(v) if isinstance(v, list) else v

        return cls(
            name=entry.name,
            path=entry.path,
            rank=entry.lora_rank,
            alpha=entry.lora_alpha,
            target_modules=names(entry.target_modules) or "all-linear",
            exclude_modules=names(entry.exclude_modules),
        )


def apply_lora(model: nn.Module, s: LoraSettings) -> PeftModel:
    """Wrap `model` (before any sharding) with a trainable adapter; base weights are frozen."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if s.path:
        folder = Path(s.path)
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"model.lora_configs[0].path: {folder} has no adapter_config.json; give a peft adapter "
                "folder (e.g. a checkpoint's huggingface/lora_adapter) or leave path empty for a new adapter"
            )
        return PeftModel.from_pretrained(model, str(folder), adapter_name=s.name, is_trainable=True)
    config = LoraConfig(
        r=s.rank,
        lora_alpha=s.alpha,
        target_modules=list(s.target_modules) if isinstance(s.target_modules, tuple) else s.target_modules,
        exclude_modules=list(s.exclude_modules)
        if isinstance(s.exclude_modules, tuple)
        else s.exclude_modules,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config, adapter_name=s.name)


def is_lora(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def reference_mode(model: nn.Module) -> Any:
    """Context in which the LoRA policy computes as its base model (a no-op for other models)."""
    return model.disable_adapter() if is_lora(model) else nullcontext()


def _lora_layers(model: PeftModel) -> Iterator[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def merged_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The full state dict `state` of the LoRA policy `model` as the base model's state dict with
    each adapted weight merged, W + scaling * B @ A (in fp32, cast back), keyed by base names.

    `state` is the gathered full state dict (`fsdp.full_state_dict`): the merge reads only it and
    the layers' static scaling, so it runs on CPU copies while training goes on."""
    assert is_lora(model)
    adapter = model.active_adapter
    layers = {name: layer for name, layer in _lora_layers(model) if adapter in layer.lora_A}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue  # folded into the base weight below
        module, _, leaf = key.rpartition(".")
        owner = module.removesuffix(".base_layer")
        layer = layers.get(owner) if module.endswith(".base_layer") else None
        if layer is not None and leaf == "weight":
            a = state[f"{owner}.lora_A.{adapter}.weight"].float()
            b = state[f"{owner}.lora_B.{adapter}.weight"].float()
            delta = (b @ a) * layer.scaling[adapter]
            if getattr(layer, "fan_in_fan_out", False):
                delta = delta.T
            value = (value.float() + delta).to(value.dtype)
        name = f"{owner}.{leaf}" if layer is not None else key
        out[name.removeprefix(_PREFIX)] = value
    return out


def adapter_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Only the adapter of `state` (the gathered full state dict), keyed by base weight name, for the
    `lora_adapter` sync method: `W#lora_A`, `W#lora_B`, `W#lora_scaling` (float64, one element) and
    `W#lora_T` for fan-in-fan-out layers; an explorer merges them as `merged_state_dict` does."""
    assert is_lora(model)
    adapter = model.active_adapter
    out: dict[str, torch.Tensor] = {}
    for owner, layer in _lora_layers(model):
        if adapter not in layer.lora_A:
            continue
        name = f"{owner}.weight".removeprefix(_PREFIX)
        out[name + "#lora_A"] = state[f"{owner}.lora_A.{adapter}.weight"]
        out[name + "#lora_B"] = state[f"{owner}.lora_B.{adapter}.weight"]
        out[name + "#lora_scaling"] = torch.tensor([layer.scaling[adapter]], dtype=torch.float64)
        if getattr(layer, "fan_in_fan_out", False):
            out[name + "#lora_T"] = torch.ones(1, dtype=torch.int8)
    return out


def save_adapter(model: nn.Module, state: dict[str, torch.Tensor], out: Path) -> None:
    """Write the adapter of `state` (the policy's full state dict) as a peft adapter folder."""
    from peft import get_peft_model_state_dict

    assert is_lora(model)
    adapter = model.active_adapter
    out.mkdir(parents=True, exist_ok=True)
    weights = get_peft_model_state_dict(model, state_dict=state, adapter_name=adapter)
    save_file(
        {k: v.contiguous() for k, v in weights.items()},
        str(out / "adapter_model.safetensors"),
        {"format": "pt"},
    )
    config = model.peft_config[adapter]
    config.save_pretrained(str(out))
