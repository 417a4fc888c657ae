"""A process's share of a CUDA device: cap its allocator (`cap_cuda_memory`) and hand its cached
blocks back to the driver (`release_cuda_cache`). Used where two processes share one GPU (one-GPU
mode, resolved.py): the hf rollout engine caps itself at its share, the trainer at the rest, and the
trainer empties its cache after each step so the engine beside it can wake (its startup heap frozen
first, `freeze_heap`, so the collection before it is cheap). On a CPU device cap and release do nothing
and touch no CUDA call."""

from __future__ import annotations

import gc

import torch


def _cuda_index(device: str | torch.device) -> int | None:
    """The CUDA device index of `device`; None for a non-CUDA device (no CUDA call made)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return dev.index if dev.index is not None else torch.cuda.current_device()


def cap_cuda_memory(device: str | torch.device, fraction: float) -> bool:
    """Cap this process's CUDA allocator on `device` at `fraction` of its memory; False (nothing done)
    on a CPU device."""
    index = _cuda_index(device)
    if index is None:
        return False
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return True


def freeze_heap() -> None:
    """Collect, then move every object alive now into the permanent generation (`gc.freeze`), once the
    process has started: later collections, the release's own, look only at what was made since. A full
    collection over a trainer's startup heap (torch, transformers, the model: ~400k objects) is ~0.3 s
    of CPU, and the release runs twice a step (bench/cache_release.py)."""
    gc.collect()
    gc.freeze()


def release_cuda_cache(device: str | torch.device) -> bool:
    """Collect garbage (reference cycles holding tensors), then return the CUDA allocator's cached,
    unused blocks to the driver (memory another process on the GPU can then take); False (nothing done)
    on a CPU device. Cheap after `freeze_heap`."""
    if _cuda_index(device) is None:
        return False
    gc.collect()
    torch.cuda.empty_cache()
    return True
