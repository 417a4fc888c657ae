"""GPU placement, Trinity-RFT's rule: each explorer takes `rollout_model.engine_num x
tensor_parallel_size` GPUs for its rollout engines plus `engine_num x tensor_parallel_size` for each
auxiliary model it runs itself (not those behind an `api_base`); the trainer takes the rest.

Pure functions over the config, no CUDA: the config check (`root.py`) and `rft config show` use them
with the cluster's GPU count, `rft run` turns a placement into each child's `CUDA_VISIBLE_DEVICES`
(launcher/gpus.py), the explorer lays its engines out on its own GPUs in the same order
(`explorer_layout`), and the deploy tests hold the GPU requests of deploy/docker-compose.gpu.yml and
deploy/k8s-gpu to them. GPUs are numbered 0..total-1 here; callers map them to device ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.config.explorer import ExplorerConfig, InferenceModelConfig
    from services.common.config.root import RFTConfig


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

    @property
    def idle_trainer_gpus(self) -> int:
        """Trainer GPUs no rank uses (trainer.nproc below the trainer's share)."""
        return max(len(self.trainer) - self.trainer_ranks, 0)


def place_gpus(total: int, demand: GpuDemand, *, mode: str = "both", explorers: int = 1) -> GpuPlacement:
    """Explorer k gets GPUs [k x E, (k+1) x E) (E = demand.explorer), the trainer every GPU after them.

    `mode` says who runs: both (explorers + trainer), train (trainer only), explore/bench (explorers
    only). total 0 places nothing (no GPUs declared: every process sees what its environment shows).
    Raises GpuPlacementError, naming the numbers, when the processes do not fit."""
    has_explorers = mode != "train"
    has_trainer = mode in ("both", "train", "serve")
    n = explorers if has_explorers else 0
    if total == 0:
        return GpuPlacement(0, tuple(() for _ in range(n)), ())
    per = demand.explorer
    taken = n * per
    if taken > total or (has_trainer and total - taken < demand.trainer_ranks):
        raise GpuPlacementError(_misfit(total, demand, n, has_trainer))
    blocks = tuple(tuple(range(k * per, (k + 1) * per)) for k in range(n))
    trainer = tuple(range(taken, total)) if has_trainer else ()
    return GpuPlacement(total, blocks, trainer, demand.trainer_ranks if has_trainer else 0)


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
