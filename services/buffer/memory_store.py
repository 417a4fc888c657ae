"""In-process store: the embedded default for single-machine runs, with the Redis store's semantics.

Groups get increasing sequence numbers (the stream ids of the Redis store). Each consumer group has a
cursor over them, a redelivery queue, and its leases. A group record is deleted once every consumer
group has acked (or dropped) it. Everything runs on one event loop, so each method is atomic.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from services.buffer.records import (
    GroupRecord,
    LeaseError,
    LeaseOutcome,
    LeaseRequest,
    PutOutcome,
    StoreStats,
    add_versions,
    admit,
)
from services.buffer.store import STORES


@dataclass
class _Lease:
    seqs: list[int]
    n: int
    deadline_ms: int


@dataclass
class _GroupState:
    cursor: int
    requeue: deque[int] = field(default_factory=deque)
    leases: dict[str, _Lease] = field(default_factory=dict)
    pending_n: int = 0
    acked: int = 0
    dropped_stale: int = 0
    redelivered: int = 0


# How many acked leases are remembered so a retried Ack is answered with the same count.
ACKED_MEMORY = 100_000


def now_ms() -> int:
    return int(time.time() * 1000)


class MemoryStore:
    """A `Store` in this process's memory; lost when the process ends."""

    name = "memory"

    def __init__(self, capacity: int, clock_ms: Callable[[], int] = now_ms):
        self.capacity = capacity
        self._clock_ms = clock_ms
        self._entries: dict[int, GroupRecord] = {}
        self._done_by: dict[int, set[str]] = {}
        self._next_seq = 0
        self._groups: dict[str, _GroupState] = {}
        self._producers: dict[str, int] = {}
        self._acked: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._size = 0
        self._versions: dict[int, int] = {}
        self._accepted = 0
        self._rejected = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

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
            self._entries[self._next_seq] = record
            self._next_seq += 1
            add_versions(self._versions, record.versions.items())
        if producer and sequence:
            self._producers[producer] = sequence
        self._size += total
        self._accepted += total
        return PutOutcome(stored=total)

    def _group(self, name: str, create: bool = False) -> _GroupState:
        """The consumer group's state; only a lease creates a group (Stats/Ack of a name do not)."""
        state = self._groups.get(name)
        if state is None:
            # Like XGROUP CREATE ... 0: a new consumer group sees every record still stored.
            state = _GroupState(cursor=min(self._entries, default=self._next_seq))
            if create:
                self._groups[name] = state
        return state

    def _expire(self, state: _GroupState) -> None:
        now = self._clock_ms()
        for lease_id in [lid for lid, lease in state.leases.items() if lease.deadline_ms <= now]:
            lease = state.leases.pop(lease_id)
            state.requeue.extend(lease.seqs)
            state.pending_n -= lease.n

    def _finish(self, group: str, seq: int) -> None:
        """`group` is done with `seq` (acked or dropped); delete it once every consumer group is."""
        done = self._done_by.setdefault(seq, set())
        done.add(group)
        if done.issuperset(self._groups):
            record = self._entries.pop(seq)
            del self._done_by[seq]
            self._size -= record.n
            add_versions(self._versions, record.versions.items(), sign=-1)

    def _candidates(self, state: _GroupState) -> Iterator[tuple[int, bool]]:
        """(seq, redelivery?) in serving order: the redelivery queue, then unread records."""
        for seq in state.requeue:
            yield seq, True
        for seq in range(state.cursor, self._next_seq):
            if seq in self._entries:
                yield seq, False

    async def lease(self, request: LeaseRequest) -> LeaseOutcome:
        state = self._group(request.consumer_group, create=True)
        self._expire(state)
        taken: list[tuple[int, bool]] = []
        stale: list[tuple[int, bool]] = []
        total = 0
        for seq, redelivery in self._candidates(state):
            record = self._entries[seq]
            if record.min_version < request.min_model_version:
                stale.append((seq, redelivery))
                continue
            if total and total + record.n > request.size:
                break
            taken.append((seq, redelivery))
            total += record.n
            if total >= request.size:
                break
        if total < request.size and not request.allow_partial:
            return LeaseOutcome(committed=False, available=total)
        # Commit: consume the scanned prefix (taken and stale) from the queue and the cursor.
        consumed = taken + stale
        requeued = {seq for seq, redelivery in consumed if redelivery}
        if requeued:
            state.requeue = deque(s for s in state.requeue if s not in requeued)
        new = [seq for seq, redelivery in consumed if not redelivery]
        if new:
            state.cursor = max(new) + 1
        dropped = 0
        for seq, _ in stale:
            dropped += self._entries[seq].n
            self._finish(request.consumer_group, seq)
        state.dropped_stale += dropped
        if not taken:
            return LeaseOutcome(committed=False, dropped_stale=dropped)
        redelivered = sum(self._entries[seq].n for seq, redelivery in taken if redelivery)
        state.redelivered += redelivered
        lease_id = uuid.uuid4().hex
        deadline = self._clock_ms() + request.lease_ms
        seqs = [seq for seq, _ in taken]
        state.leases[lease_id] = _Lease(seqs=seqs, n=total, deadline_ms=deadline)
        state.pending_n += total
        return LeaseOutcome(
            committed=True,
            lease_id=lease_id,
            payloads=[self._entries[seq].payload for seq in seqs],
            n=total,
            deadline_ms=deadline,
            dropped_stale=dropped,
            redelivered=redelivered,
        )

    def _take_lease(self, consumer_group: str, lease_id: str) -> tuple[_GroupState, _Lease]:
        state = self._group(consumer_group)
        self._expire(state)
        lease = state.leases.pop(lease_id, None)
        if lease is None:
            raise LeaseError(
                f"lease {lease_id!r} of consumer group {consumer_group!r} is unknown, already acked, "
                "or expired (its experiences were given back for redelivery)"
            )
        state.pending_n -= lease.n
        return state, lease

    async def ack(self, consumer_group: str, lease_id: str) -> int:
        done = self._acked.get((consumer_group, lease_id))
        if done is not None:  # a retried Ack whose reply was lost
            return done
        state, lease = self._take_lease(consumer_group, lease_id)
        self._acked[(consumer_group, lease_id)] = lease.n
        while len(self._acked) > ACKED_MEMORY:
            self._acked.popitem(last=False)
        for seq in lease.seqs:
            self._finish(consumer_group, seq)
        state.acked += lease.n
        return lease.n

    async def nack(self, consumer_group: str, lease_id: str) -> int:
        state, lease = self._take_lease(consumer_group, lease_id)
        state.requeue.extendleft(reversed(lease.seqs))
        return lease.n

    async def count_rejected(self, n: int) -> None:
        self._rejected += n

    async def stats(self, consumer_group: str) -> StoreStats:
        state = self._group(consumer_group)
        self._expire(state)
        return StoreStats(
            size=self._size,
            capacity=self.capacity,
            pending_leases=len(state.leases),
            pending_experiences=state.pending_n,
            accepted=self._accepted,
            rejected=self._rejected,
            dropped_stale=state.dropped_stale,
            redelivered=state.redelivered,
            acked=state.acked,
            per_model_version=dict(self._versions),
            store=self.name,
        )


@STORES.register("memory")
def _memory_store(endpoint, buffer) -> MemoryStore:  # noqa: ANN001 - config sections
    return MemoryStore(capacity=buffer.capacity)
