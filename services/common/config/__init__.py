"""The run config: one frozen, typed, Trinity-RFT-compatible tree validated at load, plus a resolved view.

config = load_config("run.yaml", overrides=["buffer.batch_size=8"])
resolve(config).train_batch_size
"""

from services.common.config.algorithm import AlgorithmConfig, OptimizerConfig
from services.common.config.buffer import (
    BufferConfig,
    ExperienceBufferConfig,
    FormatConfig,
    ReplayBufferConfig,
    RolloutArgs,
    TasksetConfig,
)
from services.common.config.errors import ConfigError, Problem
from services.common.config.explorer import ExplorerConfig, InferenceModelConfig
from services.common.config.loader import load_config, validate_tree
from services.common.config.model import ClusterConfig, ModelConfig
from services.common.config.resolved import Resolved, resolve
from services.common.config.root import RFTConfig, StageConfig
from services.common.config.runtime import LogConfig, MonitorConfig, SynchronizerConfig, TrainerConfig
from services.common.config.services import BufferEndpoint, Endpoint, ServicesConfig, TLSConfig

__all__ = [
    "AlgorithmConfig",
    "BufferConfig",
    "BufferEndpoint",
    "ClusterConfig",
    "ConfigError",
    "Endpoint",
    "ExperienceBufferConfig",
    "ExplorerConfig",
    "FormatConfig",
    "InferenceModelConfig",
    "LogConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptimizerConfig",
    "Problem",
    "RFTConfig",
    "ReplayBufferConfig",
    "Resolved",
    "RolloutArgs",
    "ServicesConfig",
    "StageConfig",
    "SynchronizerConfig",
    "TLSConfig",
    "TasksetConfig",
    "TrainerConfig",
    "load_config",
    "resolve",
    "validate_tree",
]
