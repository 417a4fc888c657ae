"""Run members as the synchronizer sees them: role, status enum (values mirror `rft.v1.MemberStatus`),
steps, the weights each holds, and the heartbeat clock.

Statuses: STARTING (registered, not yet running), RUNNING, REQUIRE_SYNC (an explorer waits for
newer weights), WAITING_SYNC (the trainer waits for receivers to be ready), SYNCING (a transfer is
in flight), STOPPED (left cleanly), FAILED (reported a failure), LOST (silent for longer than
`heartbeat_timeout`; it must register again). STOPPED, FAILED and LOST members are out of the run:
they hold no rank in the broadcast group and no sync waits for them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Role(enum.IntEnum):
    TRAINER = 1
    EXPLORER = 2


class MemberStatus(enum.IntEnum):
    STARTING = 1
    RUNNING = 2
    REQUIRE_SYNC = 3
    WAITING_SYNC = 4
    SYNCING = 5
    STOPPED = 6
    FAILED = 7
    LOST = 8

    @property
    def alive(self) -> bool:
        return self not in (MemberStatus.STOPPED, MemberStatus.FAILED, MemberStatus.LOST)


@dataclass
class Member:
    """One registered member. `step`: steps it finished; `model_version`: weights it holds."""

    member_id: str
    role: Role
    status: MemberStatus = MemberStatus.STARTING
    step: int = 0
    model_version: int = 0
    address: str = ""
    workers: int = 1
    weight_sync_port: int = 0
    last_heartbeat: float = 0.0
    # explorer: steps finished when it last received weights (explorer_driven plan)
    last_sync_step: int = 0
    # explorer: the version it waits for while REQUIRE_SYNC
    wants_version: int = 0
    # order of (re)registration; broadcast ranks follow it
    seq: int = field(default=0)

    @property
    def alive(self) -> bool:
        return self.status.alive


@dataclass(frozen=True)
class Event:
    """One entry of the core's history (tests read the interleaving from it)."""

    kind: str  # register, publish, wait, ready, receive, reported, lost, left, generation, timeout, abandoned
    member_id: str = ""
    version: int = 0
    step: int = 0
    detail: str = ""
