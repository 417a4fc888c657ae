"""Where one explorer puts its engines: rollout engine i on its GPUs [i x tp, (i+1) x tp), each local
auxiliary model on the GPUs after them (`explorer_layout` in services/common/config/gpus.py, the rule
`rft run` and the deploy manifests size each explorer's share by). The numbers index the GPUs this
process sees: its own share under `rft run` with `cluster.gpu_per_node`, in a GPU container or a k8s
pod (the device plugin shows it exactly the GPUs it requested)."""

from __future__ import annotations

from services.common.config import ExplorerConfig
from services.common.config.gpus import explorer_gpu_count, explorer_layout


def engine_devices(explorer: ExplorerConfig, visible: int) -> tuple[list[str | None], list[str | None]]:
    """The device of each rollout engine and of each auxiliary model ("cuda:k"), given how many GPUs
    this process sees. None lets the engine choose (CPU without CUDA; with fewer GPUs than the engines
    take, every engine shares the visible ones, as without placement)."""
    engines, aux = explorer_layout(explorer)
    if visible == 0 or visible < explorer_gpu_count(explorer):
        return [None] * len(engines), [None] * len(aux)
    return [f"cuda:{g}" for g in engines], [None if g is None else f"cuda:{g}" for g in aux]
