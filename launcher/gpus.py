"""Which GPUs each process of an `rft run` stage sees, as its `CUDA_VISIBLE_DEVICES`.

The placement is Trinity-RFT's rule (services/common/config/gpus.py) for this run's number of
explorers: explorer k gets the GPUs of its rollout engines and auxiliary models, the trainer the rest
(its torchrun ranks take cuda:0..nproc-1 of them). `rft run` starts every process on this host, so
there are `cluster.gpu_per_node` GPUs: the ids listed in the user's `CUDA_VISIBLE_DEVICES` when it is
set (to confine a run to some GPUs), else 0..gpu_per_node-1. The buffer and the synchronizer need no
GPU and see none. With `gpu_per_node: 0` nothing is set and every process sees what the environment
shows (the trainer and rollout engine 0 then share the first GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.common.config import RFTConfig
from services.common.config.gpus import GpuPlacementError, gpu_demand, place_gpus

VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class StageGpus:
    """The `CUDA_VISIBLE_DEVICES` of each process of a stage; `placed` False: leave them alone."""

    placed: bool
    explorers: tuple[str, ...] = ()
    trainer: str = ""
    warnings: tuple[str, ...] = ()

    def env(self, service: str, explorer_index: int = 0) -> dict[str, str]:
        """Extra environment of one process (`explorer_index`: which explorer, 0..n-1)."""
        if not self.placed:
            return {}
        if service == "explorer":
            return {VISIBLE: self.explorers[explorer_index]}
        return {VISIBLE: self.trainer if service == "trainer" else ""}


def host_gpus(gpu_per_node: int, environ: Mapping[str, str]) -> list[str]:
    """The ids of this host's GPUs a run may use: the first `gpu_per_node` of CUDA_VISIBLE_DEVICES
    when it is set, else 0..gpu_per_node-1. Raises GpuPlacementError when it lists fewer."""
    if VISIBLE not in environ:
        return [str(i) for i in range(gpu_per_node)]
    ids = [x.strip() for x in environ[VISIBLE].split(",") if x.strip()]
    if len(ids) < gpu_per_node:
        raise GpuPlacementError(
            f"cluster.gpu_per_node is {gpu_per_node} but {VISIBLE}={environ[VISIBLE]!r} shows "
            f"{len(ids)} GPU(s); lower cluster.gpu_per_node or list more GPUs"
        )
    return ids[:gpu_per_node]


def stage_gpus(config: RFTConfig, explorers: int, environ: Mapping[str, str]) -> StageGpus:
    """The GPUs of each process of a stage with `explorers` explorers. Raises GpuPlacementError."""
    cluster = config.cluster
    if cluster.gpu_per_node == 0:
        vllm = config.explorer.rollout_model.engine_type == "vllm" and config.mode in ("both", "serve")
        return StageGpus(placed=False, warnings=(
            "cluster.gpu_per_node is 0, so rft run places no GPUs: the trainer and vLLM engine 0 "
            "share the first visible GPU; set cluster.gpu_per_node to split them",
        ) if vllm else ())  # fmt: skip
    if cluster.node_num != 1:
        raise GpuPlacementError(
            f"rft run starts every process on this host, but cluster.node_num is {cluster.node_num}; "
            "set cluster.node_num: 1 (and gpu_per_node to this host's GPUs), or deploy the services "
            "across nodes (deploy/k8s)"
        )
    ids = host_gpus(cluster.gpu_per_node, environ)
    placement = place_gpus(len(ids), gpu_demand(config), mode=config.mode, explorers=explorers)
    pick = lambda gpus: ",".join(ids[g] for g in gpus)  # noqa: E731
    warnings = ()
    if placement.idle_trainer_gpus:
        warnings = (
            f"the trainer gets GPUs {pick(placement.trainer)} but trainer.nproc is "
            f"{config.trainer.nproc}: {placement.idle_trainer_gpus} of them stay idle; "
            f"set trainer.nproc: {len(placement.trainer)} to train on all of them",
        )
    return StageGpus(
        placed=True,
        explorers=tuple(pick(gpus) for gpus in placement.explorers),
        trainer=pick(placement.trainer),
        warnings=warnings,
    )
