"""The root of the config tree (`RFTConfig`) and run stages. Cross-section rules are checked here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from services.common.config.algorithm import AlgorithmConfig
from services.common.config.base import Section
from services.common.config.buffer import BufferConfig
from services.common.config.explorer import ExplorerConfig
from services.common.config.gpus import gpu_demand, place_gpus, same_device_problem, shared_share_problem
from services.common.config.model import ClusterConfig, ModelConfig
from services.common.config.runtime import LogConfig, MonitorConfig, SynchronizerConfig, TrainerConfig
from services.common.config.services import ServicesConfig
from services.common.config.sync_plan import SyncPlan

MODES = ("both", "train", "explore", "bench", "serve")


class StageConfig(Section):
    """One stage of a multi-stage run (e.g. SFT warm-up, then GRPO). Its sections override the base ones
    key by key; each stage starts from the previous stage's HF checkpoint."""

    stage_name: str
    mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    algorithm: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    buffer: dict[str, Any] | None = None
    explorer: dict[str, Any] | None = None
    synchronizer: dict[str, Any] | None = None
    trainer: dict[str, Any] | None = None


class RFTConfig(Section):
    """One run. Every service reads the same file and takes its own section."""

    mode: Literal[MODES] = "both"  # type: ignore[valid-type]
    project: str = "rft-mesh"
    group: str = ""
    name: str = "rft"
    checkpoint_root_dir: str = "./checkpoints"
    continue_from_checkpoint: bool = True
    ignore_validator_suggestions: bool = False
    algorithm: AlgorithmConfig = AlgorithmConfig()
    model: ModelConfig = ModelConfig()
    cluster: ClusterConfig = ClusterConfig()
    buffer: BufferConfig = BufferConfig()
    explorer: ExplorerConfig = ExplorerConfig()
    synchronizer: SynchronizerConfig = SynchronizerConfig()
    trainer: TrainerConfig = TrainerConfig()
    monitor: MonitorConfig = MonitorConfig()
    log: LogConfig = LogConfig()
    services: ServicesConfig = ServicesConfig()
    stages: list[StageConfig] = []
    # Folders of user plug-in modules, imported by every service at start (services/common/plugins.py);
    # relative ones resolve against this file's folder.
    plugin_dirs: list[str] = []

    @model_validator(mode="after")
    def _batch_sizes_hold_whole_groups(self) -> RFTConfig:
        repeat = self.algorithm.repeat_times
        train = self.buffer.train_batch_size
        if train and train % repeat:
            raise ValueError(
                f"buffer.train_batch_size ({train}) must be a multiple of algorithm.repeat_times ({repeat}) "
                f"so batches hold whole groups; try {max(repeat, train // repeat * repeat)}"
            )
        return self

    @model_validator(mode="after")
    def _gpus_fit(self) -> RFTConfig:
        """The explorer's engines and the trainer's ranks fit the cluster's GPUs (Trinity-RFT's split);
        `rft run` checks again with its number of explorers. On one shared GPU, weights never go
        through NCCL between the two processes (gpus.py `same_device_problem`), and the engine's memory
        share leaves the trainer some (`shared_share_problem`). Colocated, the sync plan must be strictly
        synchronous (`SyncPlan.colocation_problem`)."""
        if self.cluster.colocate:
            if self.mode == "serve":
                raise ValueError(
                    "cluster.colocate time-shares the GPUs between rollout and training, but mode serve "
                    "answers requests while the trainer steps; set cluster.colocate: false"
                )
            found = SyncPlan.from_config(self).colocation_problem()
            if found:
                raise ValueError(f"{found[0]} is {found[1]}")
        placement = place_gpus(
            self.cluster.node_num * self.cluster.gpu_per_node,
            gpu_demand(self),
            mode=self.mode,
            colocate=self.cluster.colocate,
        )
        problem = same_device_problem(self.synchronizer.group_backend, placement.shared)
        if problem:
            raise ValueError(f"synchronizer.group_backend is {problem}")
        rollout = self.explorer.rollout_model
        if "gpu_memory_utilization" in rollout.model_fields_set:
            problem = shared_share_problem(rollout.gpu_memory_utilization, placement.shared)
            if problem:
                raise ValueError(f"explorer.rollout_model.gpu_memory_utilization is {problem}")
        return self
