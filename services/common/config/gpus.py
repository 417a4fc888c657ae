"""GPU placement, Trinity-RFT's rule: each explorer takes `rollout_model.engine_num x
tensor_parallel_size` GPUs for its rollout engines plus `engine_num x tensor_parallel_size` for each
auxiliary model it runs itself (not those behind an `api_base`); the trainer takes the rest.

Pure functions over the config, no CUDA: the config check (`root.py`) and `rft config show` use them
with the cluster's GPU count, `rft run` turns a placement into each child's `CUDA_VISIBLE_DEVICES`
(launcher/gpus.py), the explorer lays its engines out on its own GPUs in the same order
(`explorer_layout`), and the deploy tests hold the GPU requests of deploy/docker-compose.gpu.yml and
deploy/k8s-gpu to them. GPUs are numbered 0..total-1 here; callers map them to device ids.

One GPU is the one exception to "each process its own GPUs": with exactly one GPU, one explorer with
one engine (tensor_parallel_size 1, no local auxiliary model) and trainer.nproc 1 in a mode that runs
both, the trainer and the explorer share GPU 0 and the placement says so (`shared`). Every other
misfit is refused. A shared device changes how weights move (resolved.py `weight_sync_backend`: never
an NCCL group between two processes of one device) and bounds the rollout engine's memory
(resolved.py `rollout_gpu_memory_utilization`, launcher/memory_plan.py) and the trainer's (the rest, less
SHARED_GPU_MARGIN: resolved.py `trainer_gpu_memory_fraction`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.config.explorer import ExplorerConfig, InferenceModelConfig
    from services.common.config.root import RFTConfig


# Share of a shared GPU neither process's allocator may take: the two CUDA contexts, and the room
# vLLM's start-up check wants (its whole share free). The trainer caps itself at
# 1 - engine share - this (resolved.py `trainer_gpu_memory_fraction`).
SHARED_GPU_MARGIN = 0.05


class GpuPlacementError(ValueError):
    """The processes need more GPUs than there are; the message names the numbers."""


def _is_local(model: InferenceModelConfig) -> bool:
    """An auxiliary model this explorer runs itself (not one behind an OpenAI-compatible `api_base`)."""
    return bool(model.model_path) and not model.api_base


def _gpus(model: InferenceModelConfig) -> int:
    return model.engine_num * model.tensor_parallel_size


def _auxiliary_gpus(explorer: ExplorerConfig) -> int:
    return sum(_gpus(m) for m in explorer.auxiliary_models if _is_local(m))


@dataclass(frozen=True)
class GpuDemand:
    """What one explorer and the trainer need: the numbers the placement and its errors speak of."""

    engine_num: int
    tensor_parallel_size: int
    auxiliary: int  # GPUs of the auxiliary models one explorer runs
    trainer_ranks: int  # trainer.nproc: one GPU per rank

    @property
    def rollout(self) -> int:
        return self.engine_num * self.tensor_parallel_size

    @property
    def explorer(self) -> int:
        return self.rollout + self.auxiliary

    def describe_explorer(self) -> str:
        text = f"{self.engine_num} rollout engine(s) x tensor_parallel_size {self.tensor_parallel_size}"
        return text + (f" + {self.auxiliary} for auxiliary models" if self.auxiliary else "")


def gpu_demand(config: RFTConfig) -> GpuDemand:
    rollout = config.explorer.rollout_model
    return GpuDemand(
        engine_num=rollout.engine_num,
        tensor_parallel_size=rollout.tensor_parallel_size,
        auxiliary=_auxiliary_gpus(config.explorer),
        trainer_ranks=config.trainer.nproc,
    )


@dataclass(frozen=True)
class GpuPlacement:
    """GPUs (0..total-1) of each explorer process and of the trainer; all empty when total is 0."""

    total: int
    explorers: tuple[tuple[int, ...], ...]
    trainer: tuple[int, ...]
    trainer_ranks: int = 0
    shared: bool = False  # one GPU: the trainer and the explorer both use GPU 0 (`shares_one_gpu`)
    colocated: bool = False  # cluster.colocate: the trainer's ranks and the engines time-share GPUs

    @property
    def idle_trainer_gpus(self) -> int:
        """Trainer GPUs no rank uses (trainer.nproc below the trainer's share)."""
        return max(len(self.trainer) - self.trainer_ranks, 0)


def place_gpus(
    total: int, demand: GpuDemand, *, mode: str = "both", explorers: int = 1, colocate: bool = False
) -> GpuPlacement:
    """Explorer k gets GPUs [k x E, (k+1) x E) (E = demand.explorer), the trainer every GPU after them
    (`colocate`: the trainer's ranks GPUs 0..nproc-1 of the same GPUs, `place_colocated`).

    `mode` says who runs: both (explorers + trainer), train (trainer only), explore/bench (explorers
    only). total 0 places nothing (no GPUs declared: every process sees what its environment shows).
    Raises GpuPlacementError, naming the numbers, when the processes do not fit."""
    has_explorers = mode != "train"
    has_trainer = mode in ("both", "train", "serve")
    n = explorers if has_explorers else 0
    if total == 0:
        return GpuPlacement(0, tuple(() for _ in range(n)), (), colocated=colocate)
    if colocate and mode == "both":  # a stage of one side only (an SFT stage) is placed as usual
        return place_colocated(total, demand, n, has_trainer)
    if shares_one_gpu(total, demand, n, has_trainer):
        return GpuPlacement(1, ((0,),), (0,), 1, shared=True)
    per = demand.explorer
    taken = n * per
    if taken > total or (has_trainer and total - taken < demand.trainer_ranks):
        raise GpuPlacementError(_misfit(total, demand, n, has_trainer))
    blocks = tuple(tuple(range(k * per, (k + 1) * per)) for k in range(n))
    trainer = tuple(range(taken, total)) if has_trainer else ()
    return GpuPlacement(total, blocks, trainer, demand.trainer_ranks if has_trainer else 0)


def place_colocated(total: int, demand: GpuDemand, explorers: int, has_trainer: bool) -> GpuPlacement:
    """`cluster.colocate`: explorer k on GPUs [k x E, (k+1) x E), the trainer's ranks on GPUs
    0..nproc-1, both within the cluster's GPUs."""
    taken = explorers * demand.explorer
    if taken > total or demand.trainer_ranks > total:
        raise GpuPlacementError(
            f"cluster.colocate: {explorers} explorer(s) x ({demand.describe_explorer()}) = {taken} GPU(s) "
            f"and the trainer's {demand.trainer_ranks} rank(s) (trainer.nproc) must each fit the {total} "
            "GPU(s) (cluster.node_num x gpu_per_node); lower explorer.rollout_model.engine_num / "
            "tensor_parallel_size or trainer.nproc, or raise cluster.gpu_per_node"
        )
    blocks = tuple(tuple(range(k * demand.explorer, (k + 1) * demand.explorer)) for k in range(explorers))
    return GpuPlacement(total, blocks, tuple(range(total)), demand.trainer_ranks, shared=True, colocated=True)


def shares_one_gpu(total: int, demand: GpuDemand, explorers: int, has_trainer: bool) -> bool:
    """The one-GPU case: one GPU, one explorer with one single-GPU engine and no local auxiliary
    model, and a trainer of one rank. Nothing larger shares a device."""
    return (
        total == 1 and has_trainer and explorers == 1 and demand.explorer == 1 and demand.trainer_ranks == 1
    )


def weight_sync_backend(requested: str, shared: bool) -> str:
    """The backend of the nccl method's broadcast group, the one rule every member obeys (the
    synchronizer hands it out in every `GroupInfo`; weight_sync/transport.py `transport_options` puts
    it in a member's own options): where the trainer and the
    explorer share one GPU, gloo, whose loopback sends go through /dev/shm (two ranks of one device
    can never share an NCCL communicator); else what `synchronizer.group_backend` asks (auto: nccl on
    CUDA, gloo on CPU)."""
    if shared and requested == "auto":
        return "gloo"
    return requested


def shared_share_problem(share: float, shared: bool) -> str | None:
    """Why an engine's memory share leaves the trainer beside it on one GPU nothing (the trainer caps
    itself at 1 - share - SHARED_GPU_MARGIN, resolved.py); None when it does not."""
    if shared and share >= 1.0 - SHARED_GPU_MARGIN:
        return (
            f"{share}, but the trainer shares this GPU (cluster.gpu_per_node 1) and caps itself at "
            f"1 - {share} - {SHARED_GPU_MARGIN} of it, which leaves it nothing; set it below "
            f"{1.0 - SHARED_GPU_MARGIN:.2f} (unset: 0.3 on a shared GPU), or give the explorer its own GPU "
            "(cluster.gpu_per_node: 2)"
        )
    return None


def same_device_problem(requested: str, shared: bool) -> str | None:
    """Why a config asks for NCCL between two processes of one GPU (an explicit group backend nccl on
    a shared GPU), with the fix; None when it does not."""
    if shared and requested == "nccl":
        return (
            "nccl, but the trainer and the explorer share one GPU (cluster.gpu_per_node 1), and NCCL "
            "cannot join two processes of one device; set synchronizer.group_backend: auto (the weights "
            "then go through shared host memory), or give the explorer its own GPU (cluster.gpu_per_node: 2)"
        )
    return None


def _misfit(total: int, demand: GpuDemand, n: int, has_trainer: bool) -> str:
    taken = n * demand.explorer
    parts = []
    if n:
        parts.append(f"{n} explorer(s) x ({demand.describe_explorer()}) = {taken} GPU(s)")
    if has_trainer:
        left = max(total - taken, 0)
        parts.append(
            f"the trainer needs {demand.trainer_ranks} (trainer.nproc {demand.trainer_ranks}, one GPU per "
            f"rank) and {left} {'is' if left == 1 else 'are'} left"
        )
    fixes = ["raise cluster.gpu_per_node"]
    if total == 1 and n and has_trainer:
        fixes.append(
            "share the one GPU: one explorer with explorer.rollout_model.engine_num 1, "
            "tensor_parallel_size 1, no local auxiliary model, and trainer.nproc 1"
        )
    if n:
        fixes.append("lower explorer.rollout_model.engine_num / tensor_parallel_size")
    if has_trainer and demand.trainer_ranks > 1:
        fixes.append("lower trainer.nproc")
    return (
        f"the processes need more GPUs than the {total} there are (cluster.node_num x gpu_per_node): "
        + "; ".join(parts)
        + "; "
        + " or ".join(fixes)
    )


def explorer_gpu_count(explorer: ExplorerConfig) -> int:
    """GPUs one explorer process takes: its rollout engines and its local auxiliary models."""
    return _gpus(explorer.rollout_model) + _auxiliary_gpus(explorer)


def explorer_layout(explorer: ExplorerConfig) -> tuple[list[int], list[int | None]]:
    """Inside one explorer process (GPUs 0..E-1 of its own): the first GPU of each rollout engine
    (engine i: [i x tp, (i+1) x tp)) and of each auxiliary model (after the rollout engines, in
    order; None for a model behind an `api_base`)."""
    rollout = explorer.rollout_model
    tp = rollout.tensor_parallel_size
    engines = [i * tp for i in range(rollout.engine_num)]
    nxt = _gpus(rollout)
    aux: list[int | None] = []
    for m in explorer.auxiliary_models:
        if _is_local(m):
            aux.append(nxt)
            nxt += _gpus(m)
        else:
            aux.append(None)
    return engines, aux
