"""What the trainer's cache release costs after each step on a GPU shared with the rollout engine.

    python bench/cache_release.py [--reps N] [--device cpu|cuda]

In one-GPU mode the trainer hands its allocator's cached blocks back after every step and every weight
gather (`services/common/gpu_memory.py release_cuda_cache`), after a full garbage collection. The
baseline collects over the whole heap, as the release did before; ours after `freeze_heap` (the startup
heap moved to the permanent generation), as the trainer now does once started. Both run in a heap like
the trainer's (its modules, torch, transformers and a loaded model), after a simulated step that leaves
reference cycles holding tensors; each side must free every one of them (checked through weak
references). On a CUDA device both empty the cache too. Medians over `--reps`, alternating (the heap is
unfrozen for each baseline round). JSON last line: whole_s, frozen_s, ratio (whole / frozen),
heap_objects.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import torch  # noqa: E402

import services.trainer.service  # noqa: E402, F401  (the trainer process's modules)
from launcher.tiny_model import make_tiny_model  # noqa: E402
from services.common.gpu_memory import freeze_heap, release_cuda_cache  # noqa: E402
from services.common.modeling import load_model  # noqa: E402

CYCLES = 200  # reference cycles a simulated step leaves behind, each holding a tensor


def step_garbage(device: str) -> list[weakref.ref]:
    """A step's leftovers: many short-lived objects and `CYCLES` cycles that only a collection frees."""
    refs = []
    for _ in range(CYCLES):
        a: dict = {"t": torch.ones(256, device=device)}
        b = {"a": a}
        a["b"] = b
        refs.append(weakref.ref(a["t"]))
    _ = [[{} for _ in range(20)] for _ in range(2000)]
    return refs


def release(device: str) -> float:
    start = time.perf_counter()
    if not release_cuda_cache(device):  # a CPU device: the release's collection alone
        gc.collect()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(make_tiny_model(Path(tmp) / "model"), dtype="float32", device=args.device)
    times: dict[str, list[float]] = {"whole": [], "frozen": []}
    for _ in range(args.reps):
        for name in ("whole", "frozen"):
            gc.unfreeze()
            if name == "frozen":
                freeze_heap()
            refs = step_garbage(args.device)
            times[name].append(release(args.device))
            alive = sum(r() is not None for r in refs)
            if alive:
                raise SystemExit(f"{name}: {alive} of {CYCLES} cycles still hold their tensors")
    heap = len(gc.get_objects()) + gc.get_freeze_count()
    whole, frozen = statistics.median(times["whole"]), statistics.median(times["frozen"])
    out = {
        "bench": "cache_release",
        "device": args.device,
        "reps": args.reps,
        "heap_objects": heap,
        "parameters": sum(p.numel() for p in model.parameters()),
        "whole_s": round(whole, 4),
        "frozen_s": round(frozen, 5),
        "ratio": round(whole / max(frozen, 1e-9), 1),
    }
    print(
        f"collection over the whole heap {whole * 1e3:.1f} ms, after freeze_heap {frozen * 1e3:.2f} ms per release"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
