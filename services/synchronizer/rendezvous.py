"""The nccl method's rendezvous book: which group instance (generation) is current, who holds which
ranks in it, and where rank 0 hosts it.

The group is trainer rank 0 plus every rollout worker of every live explorer: explorers take
consecutive ranks in registration order (an explorer with `workers` = 2 after one with 1 worker gets
ranks 2 and 3), world size = 1 + all workers. Any change of that membership (an explorer registers,
stops, fails or is marked LOST) or a failed broadcast starts a new generation: every member tears
its group down and joins again with the new `GroupInfo` (the transport refuses stale generations).
Each generation gets a fresh master port unless the trainer registered a fixed `weight_sync_port`:
one free here when the trainer's host is an address of this machine (`rft run`: every member on
loopback), else a random one from the ephemeral range, since no port of another host (a container, a
pod) can be tested from here; one taken there fails the join, and the failed broadcast starts the next
generation with another port. Tensor specs come from the trainer (`set_specs`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from services.synchronizer.members import Member, Role
from services.weight_sync import GroupInfo, TensorSpec, free_port


@dataclass(frozen=True)
class Assignment:
    """What one member gets from GetWeightSyncInfo: the group instance and its own ranks."""

    info: GroupInfo
    ranks: tuple[int, ...]


EPHEMERAL_PORTS = (32768, 60999)  # Linux's default ip_local_port_range, where free_port's ports come from


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]") or "127.0.0.1"


def master_port(host: str) -> int:
    """A port for rank 0's store on `host`: free here when `host` is an address of this machine,
    else a random ephemeral one (the trainer runs on another host, whose ports cannot be probed)."""
    try:
        return free_port("127.0.0.1" if host == "0.0.0.0" else host)
    except OSError:  # EADDRNOTAVAIL: another host's address (or a name that does not resolve here)
        return random.SystemRandom().randint(*EPHEMERAL_PORTS)


class Rendezvous:
    def __init__(self, *, backend: str = "auto", timeout_s: float = 3600.0, bucket_bytes: int = 64 << 20):
        self.backend = backend
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        self.generation = 0
        self.specs: tuple[TensorSpec, ...] = ()
        self._address = "127.0.0.1"
        self._port = 0
        self._ranks: dict[str, tuple[int, ...]] = {}
        self._world = 1

    def rebuild(self, members: Sequence[Member]) -> int:
        """Start a new generation for the live members; returns it."""
        trainer = next((m for m in members if m.role == Role.TRAINER and m.alive), None)
        self._address = _host(trainer.address) if trainer else "127.0.0.1"
        fixed_port = trainer.weight_sync_port if trainer else 0
        self._port = fixed_port or master_port(self._address)
        explorers = sorted((m for m in members if m.role == Role.EXPLORER and m.alive), key=lambda m: m.seq)
        self._ranks = {trainer.member_id: (0,)} if trainer else {}
        rank = 1
        for m in explorers:
            n = max(1, m.workers)
            self._ranks[m.member_id] = tuple(range(rank, rank + n))
            rank += n
        self._world = rank
        self.generation += 1
        return self.generation

    def set_specs(self, specs: Sequence[TensorSpec]) -> bool:
        """Record the trainer's tensor specs; True when they changed (the group must be rebuilt)."""
        specs = tuple(specs)
        changed = bool(self.specs) and specs != self.specs
        self.specs = specs
        return changed

    def participants(self) -> list[str]:
        """Explorer member ids of the current generation (everyone but rank 0)."""
        return [mid for mid, ranks in self._ranks.items() if ranks != (0,)]

    @property
    def world_size(self) -> int:
        return self._world

    def assignment(self, member_id: str) -> Assignment | None:
        """The member's ranks in the current generation; None when it holds none or no group exists."""
        ranks = self._ranks.get(member_id)
        if ranks is None or self._world < 2:
            return None
        info = GroupInfo(
            master_address=self._address,
            master_port=self._port,
            world_size=self._world,
            specs=self.specs,
            generation=self.generation,
            backend=self.backend,
            timeout_s=self.timeout_s,
            bucket_bytes=self.bucket_bytes,
        )
        return Assignment(info, ranks)
