"""Print the versions the GPU check depends on (python, torch, CUDA, NCCL, cuDNN, device, the wire stack).

Run by scripts/gpu_probe.sh's `setup` step (`--compact`: one line); exits non-zero if torch sees no CUDA device or bf16 is missing.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys


def versions() -> dict[str, object]:
    """One dict of everything worth quoting next to a GPU figure."""
    import torch

    out: dict[str, object] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
        out["device_count"] = torch.cuda.device_count()
        out["bf16"] = torch.cuda.is_bf16_supported()
        out["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        out["cudnn"] = torch.backends.cudnn.version()
        try:
            out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            out["nccl"] = f"unavailable: {exc}"
    for name in ("transformers", "peft", "google.protobuf", "grpc", "numpy", "safetensors", "tokenizers"):
        try:
            mod = importlib.import_module(name)
            out[name] = getattr(mod, "__version__", "?")
            out[f"{name}_path"] = getattr(mod, "__file__", "?")
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            out[name] = f"missing: {exc}"
    return out


def main() -> int:
    info = versions()
    print(json.dumps(info) if "--compact" in sys.argv[1:] else json.dumps(info, indent=1))
    return 0 if info.get("cuda_available") and info.get("bf16") else 1


if __name__ == "__main__":
    sys.exit(main())
