"""Replay-buffer store (Trinity-RFT `replay_buffer`): groups are handed out by priority and reused.

priority = model_version - decay * use_count (`linear_decay`); `decay_limit_randomization` adds
Gaussian noise (`sigma`). A lease takes the highest-priority groups that are ready. Acking a lease counts
one use of each group: a group is reused after `reuse_cooldown_time` seconds until it has been used
`use_count_limit` times (no reuse when the cooldown is None), and each handed-out copy carries its
`use_count`. Nack or lease expiry makes a group ready again without counting a use. Capacity, leases,
staleness and stats behave as in the other stores; one pool serves every consumer group. In memory only.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rft.v1 import buffer_pb2

from services.buffer.memory_store import now_ms
from services.buffer.records import (
    GroupRecord,
    LeaseError,
    LeaseOutcome,
    LeaseRequest,
    PutOutcome,
    StoreStats,
    add_versions,
    admit,
    encode_member,
)


@dataclass
class _Item:
    seq: int
    record: GroupRecord
    use_count: int = 0
    ready_ms: int = 0
    leased: bool = False


@dataclass
class _Lease:
    seqs: list[int]
    n: int
    deadline_ms: int


class ReplayStore:
    name = "memory-replay"

    def __init__(
        self,
        capacity: int,
        *,
        priority_fn: str = "linear_decay",
        decay: float = 2.0,
        sigma: float = 0.0,
        reuse_cooldown_s: float | None = None,
        use_count_limit: int = 3,
        clock_ms: Callable[[], int] = now_ms,
        seed: int = 0,
    ):
        self.capacity = capacity
        self.priority_fn, self.decay, self.sigma = priority_fn, decay, sigma
        self.reuse_cooldown_s, self.use_count_limit = reuse_cooldown_s, use_count_limit
        self._clock_ms = clock_ms
        self._rng = random.Random(seed)
        self._items: dict[int, _Item] = {}
        self._leases: dict[str, _Lease] = {}
        self._acked_leases: dict[str, int] = {}
        self._next_seq = 0
        self._producers: dict[str, int] = {}
        self._size = 0
        self._versions: dict[int, int] = {}
        self._counts = {"accepted": 0, "rejected": 0, "dropped_stale": 0, "redelivered": 0, "acked": 0}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def priority(self, item: _Item) -> float:
        value = item.record.min_version - self.decay * item.use_count
        if self.priority_fn == "decay_limit_randomization" and self.sigma:
            value += self._rng.gauss(0.0, self.sigma)
        return value

    async def put(
        self, groups: Sequence[GroupRecord], *, producer: str = "", sequence: int = 0
    ) -> PutOutcome:
        total = admit(
            groups,
            size=self._size,
            capacity=self.capacity,
            producers=self._producers,
            producer=producer,
            sequence=sequence,
        )
        if total is None:
            return PutOutcome(stored=0, duplicate=True)
        for record in groups:
            self._items[self._next_seq] = _Item(self._next_seq, record)
            self._next_seq += 1
            add_versions(self._versions, record.versions.items())
        if producer and sequence:
            self._producers[producer] = sequence
        self._size += total
        self._counts["accepted"] += total
        return PutOutcome(stored=total)

    def _remove(self, item: _Item) -> None:
        del self._items[item.seq]
        self._size -= item.record.n
        add_versions(self._versions, item.record.versions.items(), sign=-1)

    def _expire(self) -> None:
        now = self._clock_ms()
        for lease_id in [lid for lid, lease in self._leases.items() if lease.deadline_ms <= now]:
            for seq in self._leases.pop(lease_id).seqs:
                self._items[seq].leased = False

    def _payload(self, item: _Item) -> bytes:
        if item.use_count == 0:
            return item.record.payload
        msg = buffer_pb2.GetBatchResponse.FromString(item.record.payload)
        for exp in msg.experiences:
            exp.use_count = item.use_count
        return b"".join(encode_member(exp) for exp in msg.experiences)

    async def lease(self, request: LeaseRequest) -> LeaseOutcome:
        self._expire()
        now = self._clock_ms()
        dropped = 0
        for item in [i for i in self._items.values() if not i.leased]:
            if item.record.min_version < request.min_model_version:
                dropped += item.record.n
                self._remove(item)
        self._counts["dropped_stale"] += dropped
        ready = sorted(
            (i for i in self._items.values() if not i.leased and i.ready_ms <= now),
            key=lambda i: (-self.priority(i), i.seq),
        )
        taken, total = [], 0
        for item in ready:
            if total and total + item.record.n > request.size:
                break
            taken.append(item)
            total += item.record.n
            if total >= request.size:
                break
        if not taken or (total < request.size and not request.allow_partial):
            return LeaseOutcome(committed=False, available=total, dropped_stale=dropped)
        lease_id = uuid.uuid4().hex
        deadline = now + request.lease_ms
        for item in taken:
            item.leased = True
        self._leases[lease_id] = _Lease([i.seq for i in taken], total, deadline)
        return LeaseOutcome(
            committed=True,
            lease_id=lease_id,
            payloads=[self._payload(i) for i in taken],
            n=total,
            deadline_ms=deadline,
            dropped_stale=dropped,
        )

    def _take(self, lease_id: str) -> _Lease:
        self._expire()
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            raise LeaseError(f"lease {lease_id!r} is unknown, already acked, or expired")
        return lease

    async def ack(self, consumer_group: str, lease_id: str) -> int:
        if lease_id in self._acked_leases:
            return self._acked_leases[lease_id]
        lease = self._take(lease_id)
        now = self._clock_ms()
        for seq in lease.seqs:
            item = self._items[seq]
            item.leased = False
            item.use_count += 1
            if self.reuse_cooldown_s is None or item.use_count >= self.use_count_limit:
                self._remove(item)
            else:
                item.ready_ms = now + int(self.reuse_cooldown_s * 1000)
        self._counts["acked"] += lease.n
        self._acked_leases[lease_id] = lease.n
        return lease.n

    async def nack(self, consumer_group: str, lease_id: str) -> int:
        lease = self._take(lease_id)
        for seq in lease.seqs:
            self._items[seq].leased = False
        return lease.n

    async def count_rejected(self, n: int) -> None:
        self._counts["rejected"] += n

    async def stats(self, consumer_group: str) -> StoreStats:
        self._expire()
        return StoreStats(
            size=self._size,
            capacity=self.capacity,
            pending_leases=len(self._leases),
            pending_experiences=sum(lease.n for lease in self._leases.values()),
            per_model_version=dict(self._versions),
            store=self.name,
            **self._counts,
        )
