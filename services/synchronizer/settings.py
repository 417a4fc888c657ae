"""`SynchronizerSettings`: what the synchronizer core needs from the run config, read once in the
service entry (`services.synchronizer.service.build_core`) from the `synchronizer` section: the weight
sync method, the sync plan (style, interval, offset), the timeouts, the transfer bucket sizes and the
broadcast group's backend it hands out to every member (resolved.py `weight_sync_backend`)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import RFTConfig, resolve
from services.synchronizer.plan import SyncPlan

__all__ = ["SynchronizerSettings"]


@dataclass(frozen=True)
class SynchronizerSettings:
    method: str = "nccl"
    plan: SyncPlan = SyncPlan()
    sync_timeout: float = 3600.0
    heartbeat_timeout: float = 60.0
    bucket_bytes: int = 64 << 20
    chunk_bytes: int = 4 << 20
    backend: str = "auto"

    @classmethod
    def from_config(cls, config: RFTConfig) -> SynchronizerSettings:
        s = config.synchronizer
        return cls(
            method=s.sync_method,
            plan=SyncPlan(s.sync_style, s.sync_interval, s.sync_offset),
            sync_timeout=s.sync_timeout,
            heartbeat_timeout=s.heartbeat_timeout,
            bucket_bytes=s.bucket_bytes,
            chunk_bytes=s.chunk_bytes,
            backend=resolve(config).weight_sync_backend,  # gloo where trainer and explorer share a GPU
        )
