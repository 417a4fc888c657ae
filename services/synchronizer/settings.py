"""`SynchronizerSettings`: what the synchronizer core needs from the run config, read once in the
service entry (`services.synchronizer.service.build_core`) from the `synchronizer` section: the weight
sync method (resolved here, once, into its `SyncMethod`), the sync plan (`SyncPlan`: style, interval,
offset), the timeouts, the transfer bucket sizes and the
broadcast group's backend it hands out to every member (resolved.py `weight_sync_backend`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.config import RFTConfig, resolve
from services.common.config.sync_plan import SyncPlan
from services.weight_sync.method import SyncMethod, sync_method

__all__ = ["SynchronizerSettings"]


@dataclass(frozen=True)
class SynchronizerSettings:
    method: SyncMethod = field(default_factory=lambda: sync_method("nccl"))
    plan: SyncPlan = SyncPlan()
    sync_timeout: float = 3600.0
    heartbeat_timeout: float = 60.0
    bucket_bytes: int = 64 << 20
    chunk_bytes: int = 4 << 20
    backend: str = "auto"
    fanout: int = 0  # pushed methods: 0 = star; k = explorers relay versions down a k-ary tree

    @property
    def tree_fanout(self) -> int:
        """The relay tree's fan-out: `fanout` for a pushed method, else 0 (star; `SyncMethod.tree_fanout`)."""
        return self.method.tree_fanout(self.fanout)

    @classmethod
    def from_config(cls, config: RFTConfig) -> SynchronizerSettings:
        s = config.synchronizer
        return cls(
            method=sync_method(s.sync_method, s.wire_dtype),  # an unknown name raises, listing the known ones
            plan=resolve(config).sync_plan,
            sync_timeout=s.sync_timeout,
            heartbeat_timeout=s.heartbeat_timeout,
            bucket_bytes=s.bucket_bytes,
            chunk_bytes=s.chunk_bytes,
            backend=resolve(config).weight_sync_backend,  # gloo where trainer and explorer share a GPU
            fanout=s.fanout,
        )
