"""Which GPUs each process of an `rft run` stage sees, as its `CUDA_VISIBLE_DEVICES`.

The placement is Trinity-RFT's rule (services/common/config/gpus.py) for this run's number of
explorers: explorer k gets the GPUs of its rollout engines and auxiliary models, the trainer the rest
(its torchrun ranks take cuda:0..nproc-1 of them). `rft run` starts every process on this host, so
there are `cluster.gpu_per_node` GPUs: the ids listed in the user's `CUDA_VISIBLE_DEVICES` when it is
set (to confine a run to some GPUs), else 0..gpu_per_node-1. The buffer and the synchronizer need no
GPU and see none. With `gpu_per_node: 1` and one engine and one trainer rank, both see the one GPU
(one-GPU mode: the placement is `shared`). With `gpu_per_node: 0` nothing is set and every process
sees what the environment shows: on a CUDA machine the trainer and rollout engine 0 then both use the
first GPU, so a run whose weights would go through an NCCL group between them is refused before it
starts (`host_cuda` counts the devices with nvidia-smi; no CUDA context is made here).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from services.common.config import RFTConfig, resolve
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


@dataclass(frozen=True)
class HostCuda:
    """The CUDA devices the processes of `rft run` would see, and the smallest one's memory."""

    devices: int = 0
    memory_gib: float | None = None


def host_cuda(environ: Mapping[str, str], timeout_s: float = 10.0) -> HostCuda:
    """Ask nvidia-smi (no CUDA context in this process); none when it is missing, fails, or
    CUDA_VISIBLE_DEVICES hides every device."""
    visible = environ.get(VISIBLE)
    if visible is not None and visible.strip() in ("", "-1"):
        return HostCuda()
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return HostCuda()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout  # fmt: skip
        rows = [line.split(",") for line in out.strip().splitlines() if line.strip()]
        sizes = {r[0].strip(): float(r[1]) / 1024 for r in rows}  # MiB -> GiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return HostCuda()
    if visible is not None:
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        picked = [sizes[i] for i in ids if i in sizes]
        count = len(ids) if all(i.isdigit() for i in ids) else len(sizes)
        sizes_used = picked or list(sizes.values())
    else:
        count, sizes_used = len(sizes), list(sizes.values())
    return HostCuda(count, min(sizes_used) if sizes_used else None)


def one_device_nccl(config: RFTConfig, cuda_devices: int) -> str | None:
    """With `gpu_per_node: 0` on a machine with CUDA, the trainer and rollout engine 0 both use the
    first device: why a run whose weights would cross between them through NCCL cannot work; None
    when nothing is wrong (no CUDA, GPUs placed, one side missing, a method without a broadcast
    group, or its backend set to gloo)."""
    if config.cluster.gpu_per_node or not cuda_devices or config.mode not in ("both", "serve"):
        return None
    from services.weight_sync.method import sync_method  # torch: only on a CUDA machine

    if not sync_method(config.synchronizer.sync_method).broadcast:
        return None
    if resolve(config).weight_sync_backend == "gloo":
        return None
    return (
        f"cluster.gpu_per_node is 0 and this machine shows {cuda_devices} CUDA device(s): the trainer "
        "and the rollout engine would both use the first one, and the nccl weight sync cannot join two "
        "processes of one device; set cluster.gpu_per_node: 1 (one GPU shared, weights through shared "
        "host memory) or the number of GPUs to split them, or synchronizer.sync_method: memory"
    )


def stage_gpus(
    config: RFTConfig, explorers: int, environ: Mapping[str, str], cuda_devices: int = 0
) -> StageGpus:
    """The GPUs of each process of a stage with `explorers` explorers (`cuda_devices`: the CUDA
    devices this host shows, for the `gpu_per_node: 0` check). Raises GpuPlacementError."""
    cluster = config.cluster
    if config.trainer.nnodes != 1:
        raise GpuPlacementError(
            f"rft run starts every process on this host, but trainer.nnodes is {config.trainer.nnodes}; "
            "set trainer.nnodes: 1, or run the trainer across hosts with the multi-node compose override "
            "or Kubernetes overlay (docs/multi-node.md)"
        )
    if cluster.gpu_per_node == 0:
        problem = one_device_nccl(config, cuda_devices)
        if problem:
            raise GpuPlacementError(problem)
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
    placement = place_gpus(
        len(ids), gpu_demand(config), mode=config.mode, explorers=explorers, colocate=config.cluster.colocate
    )
    pick = lambda gpus: ",".join(ids[g] for g in gpus)  # noqa: E731
    warnings: tuple[str, ...] = ()
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
