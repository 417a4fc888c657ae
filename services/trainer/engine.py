"""The `TrainEngine` protocol the trainer core drives, and its FSDP2 implementation.

The core (rank 0) sees only `TrainEngine` (Trinity-RFT's `TrainEngineWrapper`, minus Ray): one
step on a collated batch, checkpoint save / wait / load, and the full state dict for weight sync.
`FSDPEngine` runs each call on every rank: it broadcasts a `Command` to the worker ranks (sitting
in `serve_workers`) and runs the same `FSDPWorker` method itself.  Engine calls are blocking torch
work; the core runs them in a thread, one at a time.  The `fsdp` argument only picks the wrapping
(None: FSDP2 with several ranks or on CUDA, the plain module in one CPU process; `fsdp.uses_fsdp`).
Every command that issues collectives on the training device runs under that device's
`issuing_collectives` lock (`services.common.collective_lock`), so a weight-sync broadcast sent from
another thread never has collectives in flight beside the step's (`wait_for_save` only waits for
disk writes and takes no lock).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from services.common.collective_lock import issuing_collectives
from services.trainer.collate import StepBatch
from services.trainer.distributed import CommandChannel, DistInfo, leave_process_group
from services.trainer.settings import TrainerSettings
from services.trainer.worker import FSDPWorker

__all__ = ["FSDPEngine", "TrainEngine"]


@runtime_checkable
class TrainEngine(Protocol):
    """What the trainer core needs from a training backend."""

    @property
    def world_size(self) -> int: ...

    @property
    def pad_token_id(self) -> int: ...

    def train_step(self, step: StepBatch) -> dict[str, float]:
        """Update the model(s) on one global batch; returns the step metrics."""

    def save_checkpoint(self, step: int, trainer_state: dict[str, Any], save_as_hf: bool, block: bool) -> str:
        """Start saving `global_step_<step>` (in the background unless `block`); returns its folder."""

    def wait_for_save(self) -> None:
        """Block until pending saves are on disk and the latest marker is written."""

    def durable_step(self) -> int:
        """The newest step whose checkpoint is complete on disk (-1: none); cheap, no collective."""

    def load_checkpoint(self, folder: str) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler and RNG; returns the saved trainer state."""

    def iter_state_dict(self, kind: str = "full") -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full CPU tensor) pairs of the policy, for weight sync (rank 0); `kind` "adapter":
        only a LoRA policy's adapter (`lora.adapter_state_dict`)."""

    def close(self) -> None:
        """Release the worker ranks."""


class FSDPEngine:
    """`TrainEngine` over `FSDPWorker`s on every rank of the default process group."""

    def __init__(self, settings: TrainerSettings, info: DistInfo, fsdp: bool | None = None):
        for name, size in (
            ("train batch", settings.train_batch_size),
            ("mini-batch", settings.mini_batch_size // settings.rows_per_experience),  # pairs stay whole
        ):
            if size % info.world_size:
                raise ValueError(f"{name} size {size} is not a multiple of the world size {info.world_size}")
        self.info = info
        self.worker = FSDPWorker(settings, info, fsdp)
        w = self.worker
        self.channel = CommandChannel(
            info,
            {
                "train_step": w.train_step,
                "save_checkpoint": w.save_checkpoint,
                "wait_for_save": w.wait_for_save,
                "load_checkpoint": w.load_checkpoint,
                "gather_state_dict": w.gather_state_dict,
            },
        )

    def _run(self, name: str, payload: Any = None) -> Any:
        """`channel.run` with the training device's collectives to itself (see the module docstring)."""
        with issuing_collectives(self.info.device):
            return self.channel.run(name, payload)

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def pad_token_id(self) -> int:
        return self.worker.pad_token_id

    def train_step(self, step: StepBatch) -> dict[str, float]:
        return self._run("train_step", step)

    def save_checkpoint(self, step: int, trainer_state: dict[str, Any], save_as_hf: bool, block: bool) -> str:
        request = {"step": step, "trainer_state": trainer_state, "save_as_hf": save_as_hf, "block": block}
        return self._run("save_checkpoint", request)

    def wait_for_save(self) -> None:
        self.channel.run("wait_for_save")

    def durable_step(self) -> int:
        return self.worker.checkpoints.durable_step

    def load_checkpoint(self, folder: str) -> dict[str, Any]:
        return self._run("load_checkpoint", folder)

    def iter_state_dict(self, kind: str = "full") -> Iterator[tuple[str, torch.Tensor]]:
        if kind == "adapter" and self.worker.settings.lora is None:  # checked before any collective
            raise ValueError(
                "synchronizer.sync_method sends only a LoRA adapter, but model.lora_configs is empty; "
                "set lora_configs or use a method that sends the whole model (e.g. memory)"
            )
        yield from self._run("gather_state_dict", kind).items()

    def serve_workers(self) -> None:
        """Ranks > 0: execute rank 0's commands until it closes the engine."""
        self.channel.worker_loop()

    def close(self) -> None:
        self.channel.stop_workers()
        leave_process_group(self.info)
