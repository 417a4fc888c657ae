"""Copy named tensors (HF parameter names) into a model in place, whatever their dtype or device.

Used by the `hf` engine for every weight source: a gRPC `LoadWeights` stream, a broadcast group, a
checkpoint folder (bench mode). Names are checked before anything is copied, so a wrong state dict
leaves the model untouched. Tied weights (`lm_head.weight` tied to the embeddings) are accepted under
either name.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch


class WeightLoadError(ValueError):
    pass


@torch.no_grad()
def copy_named_tensors(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy each (name, tensor) into the parameter or buffer of that name; returns the count copied."""
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    pairs = list(named_tensors)
    for name, tensor in pairs:
        target = targets.get(name)
        if target is None:
            close = [k for k in targets if k.endswith(name.split(".")[-1])][:3]
            raise WeightLoadError(f"model has no parameter {name!r} (similar: {', '.join(close) or 'none'})")
        if tuple(target.shape) != tuple(tensor.shape):
            raise WeightLoadError(
                f"{name}: shape {tuple(tensor.shape)} does not match the model's {tuple(target.shape)}"
            )
    for name, tensor in pairs:
        targets[name].copy_(tensor.to(device=targets[name].device, dtype=targets[name].dtype))
    return len(pairs)


def read_safetensors_folder(folder: str | Path) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of the `*.safetensors` files of a folder (an HF export or a sync-only state dict)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors files in {str(folder)!r}")
    out: list[tuple[str, torch.Tensor]] = []
    for f in files:
        out.extend(load_file(str(f)).items())
    return out
