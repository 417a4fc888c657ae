"""Plain records the synchronizer core takes and returns (the servicer maps them to `rft.v1` messages)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.synchronizer.members import Member
from services.synchronizer.settings import SynchronizerSettings


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
    settings: SynchronizerSettings
    sync_in_progress: bool
    finished: bool
    generation: int
    pending_version: int
