"""Weights from an HF folder (bench mode, checkpoint sync): every tensor of its `*.safetensors` files.

Loading into a model goes through `services.weight_sync.load_weights` (in place, dtype cast,
tied weights), the receiving end of every weight-sync method.
"""

from __future__ import annotations

from pathlib import Path

import torch

from services.weight_sync import WeightLoadError


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
