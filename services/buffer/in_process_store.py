"""In-process store: the embedded default for single-machine runs, with the Redis store's semantics.

Groups get increasing sequence numbers (the stream ids of the Redis store). Each consumer group has a
cursor over them, a redelivery queue, and its leases. A group record is deleted once every consumer
group has acked (or dropped) it. Everything runs on one event loop, so each method is atomic.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from services.buffer.records import (
    AdmittingStore,
    GroupRecord,
    LeaseOutcome,
    LeaseRequest,
    OpenOutcome,
    OpenRequest,
    StoreStats,
    add_versions,
    check_epoch,
    lease_epoch_error,
    lease_gone_error,
)
from services.buffer.store import DEFAULT_CONSUMER_GROUP, STORES


@dataclass
class _Lease:
    seqs: list[int]
    n: int
    deadline_ms: int  # 0: fenced (taken with an epoch), never expires
    consumer: str = ""
    epoch: int = 0
    taken_ms: int = 0  # when it was taken (the store's clock)


@dataclass
class _GroupState:
    cursor: int
    requeue: deque[int] = field(default_factory=deque)
    leases: dict[str, _Lease] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    pending_n: int = 0
    acked: int = 0
    dropped_stale: int = 0
    redelivered: int = 0


# How many acked leases are remembered so a retried Ack is answered with the same count, and how many
# expired ones, so that an Ack or Nack of one says it expired.
ACKED_IDS_KEPT = 100_000


def now_ms() -> int:
    return int(time.time() * 1000)


def oldest_lease_age_s(taken_ms: Iterable[int], now: int) -> float:
    """Seconds since the oldest lease was taken, given when each was (0 when there is none)."""
    return max(((now - taken) / 1000 for taken in taken_ms), default=0.0)


class InProcessStore(AdmittingStore):
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
        self._expired: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._size = 0
        self._versions: dict[int, int] = {}
        self._accepted = 0
        self._rejected = 0
        self.accepted_log: list[str] = []  # uid of every accepted experience (lineage audits)

    async def start(self, consumer_groups: Sequence[str] = (DEFAULT_CONSUMER_GROUP,)) -> None:
        for name in consumer_groups:
            self._group(name, create=True)

    async def close(self) -> None:
        return None

    def _keep(self, record: GroupRecord) -> None:
        self._entries[self._next_seq] = record
        self._next_seq += 1
        self.accepted_log.extend(record.uids)

    def _count_accepted(self, n: int) -> None:
        self._accepted += n

    def _group(self, name: str, create: bool = False) -> _GroupState:
        """The consumer group's state. `start` creates the declared groups (the core refuses any other
        name before it reaches the store); Stats/Ack of an unknown name create nothing."""
        state = self._groups.get(name)
        if state is None:
            # Like XGROUP CREATE ... 0: a new consumer group sees every record still stored.
            state = _GroupState(cursor=min(self._entries, default=self._next_seq))
            if create:
                self._groups[name] = state
        return state

    def _expire(self, state: _GroupState, group: str) -> None:
        now = self._clock_ms()
        due = [lid for lid, lease in state.leases.items() if 0 < lease.deadline_ms <= now]
        for lease_id in due:
            lease = state.leases.pop(lease_id)
            state.requeue.extend(lease.seqs)
            state.pending_n -= lease.n
            self._expired[(group, lease_id)] = None
        while len(self._expired) > ACKED_IDS_KEPT:
            self._expired.popitem(last=False)

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

    def _check_epoch(
        self, state: _GroupState, group: str, consumer: str, epoch: int, must_be_open: bool = True
    ) -> None:
        """See `records.check_epoch`."""
        check_epoch(state.epochs.get(consumer, 0), epoch, group, consumer, must_be_open=must_be_open)

    async def open_consumer(self, request: OpenRequest) -> OpenOutcome:
        consumer_group, consumer = request.consumer_group, request.consumer
        state = self._group(consumer_group, create=True)
        self._expire(state, consumer_group)
        epoch = state.epochs.get(consumer, 0) + 1
        state.epochs[consumer] = epoch
        wanted, acked, released, back = set(request.ack_lease_ids), 0, 0, []
        keep = set(request.keep_lease_ids)
        for lease_id, lease in list(state.leases.items()):
            if lease.consumer != consumer:
                continue
            if lease_id in keep:
                lease.epoch = epoch
                continue
            del state.leases[lease_id]
            state.pending_n -= lease.n
            if lease_id in wanted:
                for seq in lease.seqs:
                    self._finish(consumer_group, seq)
                state.acked += lease.n
                acked += lease.n
            else:
                back.extend(lease.seqs)
                released += lease.n
        state.requeue.extendleft(reversed(sorted(back)))
        return OpenOutcome(epoch=epoch, acked=acked, released=released)

    async def lease(self, request: LeaseRequest) -> LeaseOutcome:
        state = self._group(request.consumer_group, create=True)
        self._check_epoch(state, request.consumer_group, request.consumer or "trainer", request.epoch)
        self._expire(state, request.consumer_group)
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
        deadline = 0 if request.epoch else self._clock_ms() + request.lease_ms
        seqs = [seq for seq, _ in taken]
        state.leases[lease_id] = _Lease(
            seqs=seqs,
            n=total,
            deadline_ms=deadline,
            consumer=request.consumer or "trainer",
            epoch=request.epoch,
            taken_ms=self._clock_ms(),
        )
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

    def _take_lease(
        self, consumer_group: str, lease_id: str, epoch: int, consumer: str
    ) -> tuple[_GroupState, _Lease]:
        state = self._group(consumer_group)
        self._expire(state, consumer_group)
        if consumer:  # a lease already given back still fences its stale holder
            self._check_epoch(state, consumer_group, consumer, epoch, must_be_open=False)
        held = state.leases.get(lease_id)
        if held is not None and held.epoch != epoch:
            raise lease_epoch_error(lease_id, consumer_group, held.epoch, epoch)
        lease = state.leases.pop(lease_id, None)
        if lease is None:
            raise lease_gone_error(lease_id, consumer_group, (consumer_group, lease_id) in self._expired)
        state.pending_n -= lease.n
        return state, lease

    async def ack(self, consumer_group: str, lease_id: str, epoch: int = 0, consumer: str = "") -> int:
        done = self._acked.get((consumer_group, lease_id))
        if done is not None:  # a retried Ack whose reply was lost
            return done
        state, lease = self._take_lease(consumer_group, lease_id, epoch, consumer)
        self._acked[(consumer_group, lease_id)] = lease.n
        while len(self._acked) > ACKED_IDS_KEPT:
            self._acked.popitem(last=False)
        for seq in lease.seqs:
            self._finish(consumer_group, seq)
        state.acked += lease.n
        return lease.n

    async def nack(self, consumer_group: str, lease_id: str, epoch: int = 0, consumer: str = "") -> int:
        state, lease = self._take_lease(consumer_group, lease_id, epoch, consumer)
        state.requeue.extendleft(reversed(lease.seqs))
        return lease.n

    async def accepted_uids(self, start: int = 0, count: int = -1) -> list[str]:
        return self.accepted_log[start:] if count < 0 else self.accepted_log[start : start + count]

    async def count_rejected(self, n: int) -> None:
        self._rejected += n

    async def stats(self, consumer_group: str) -> StoreStats:
        state = self._group(consumer_group)
        self._expire(state, consumer_group)
        return StoreStats(
            size=self._size,
            capacity=self.capacity,
            pending_leases=len(state.leases),
            pending_experiences=state.pending_n,
            oldest_lease_age_s=oldest_lease_age_s(
                (x.taken_ms for x in state.leases.values()), self._clock_ms()
            ),
            accepted=self._accepted,
            rejected=self._rejected,
            dropped_stale=state.dropped_stale,
            redelivered=state.redelivered,
            acked=state.acked,
            per_model_version=dict(self._versions),
            store=self.name,
        )


@STORES.register("memory")
def _in_process_store(endpoint, buffer) -> InProcessStore:  # noqa: ANN001 - config sections
    return InProcessStore(capacity=buffer.capacity)
