"""Plain records the synchronizer core takes and returns (the servicer maps them to `rft.v1` messages)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.config.runtime import SynchronizerConfig
from services.synchronizer.members import Member
from services.synchronizer.plan import SyncPlan


@dataclass(frozen=True)
class Settings:
    method: str = "nccl"
    plan: SyncPlan = SyncPlan()
    sync_timeout: float = 3600.0
    heartbeat_timeout: float = 60.0
    bucket_bytes: int = 64 << 20
    chunk_bytes: int = 4 << 20
    backend: str = "auto"

    @classmethod
    def from_config(cls, s: SynchronizerConfig) -> Settings:
        return cls(
            method=s.sync_method,
            plan=SyncPlan(s.sync_style, s.sync_interval, s.sync_offset),
            sync_timeout=s.sync_timeout,
            heartbeat_timeout=s.heartbeat_timeout,
            bucket_bytes=s.bucket_bytes,
            chunk_bytes=s.chunk_bytes,
        )


@dataclass(frozen=True)
class Published:
    version: int = 0
    step: int = 0
    checkpoint_path: str = ""


@dataclass(frozen=True)
class WaitResult:
    published: Published
    required: int
    timed_out: bool = False
    receive_broadcast: bool = False  # nccl: receive `published.version` now in `generation`
    generation: int = 0
    finished: bool = False


@dataclass(frozen=True)
class SyncDecision:
    accepted: bool
    published: Published
    generation: int = 0
    reason: str = ""


@dataclass
class Broadcast:
    version: int
    step: int
    generation: int
    participants: frozenset[str]
    told: set[str] = field(default_factory=set)
    accepted: bool = False


@dataclass(frozen=True)
class RunState:
    members: tuple[Member, ...]
    published: Published
    trainer_step: int
    explorer_step: int
    settings: Settings
    sync_in_progress: bool
    finished: bool
    generation: int
    pending_version: int
