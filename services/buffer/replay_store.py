"""Replay-buffer store (Trinity-RFT `replay_buffer`): groups are handed out by priority and reused.

priority = model_version - decay * use_count (`linear_decay`); `decay_limit_randomization` adds
Gaussian noise (`sigma`). A lease takes the highest-priority groups that are ready. Acking a lease counts
one use of each group: a group is reused after `reuse_cooldown_time` seconds until it has been used
`use_count_limit` times (no reuse when the cooldown is None), and each handed-out copy carries its
`use_count`. Nack, lease expiry or the consumer's OpenConsumer (a restarted trainer) makes a group
ready again without counting a use; reuse is the point here, so exactly-once does not apply. Capacity, leases,
staleness and stats behave as in the other stores; one pool serves every consumer group. In memory only.
"""

from __future__ import annotations

import random
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rft.v1 import buffer_pb2

from services.buffer.in_process_store import ACKED_IDS_KEPT, now_ms, oldest_lease_age_s
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
    encode_member,
    lease_epoch_error,
    lease_gone_error,
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
    deadline_ms: int  # 0: taken with an epoch, never expires
    consumer: str = ""
    epoch: int = 0
    taken_ms: int = 0  # when it was taken (the store's clock)


class ReplayStore(AdmittingStore):
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
        self._epochs: dict[str, int] = {}
        self._accepted_log: list[str] = []
        self._acked_leases: dict[str, int] = {}
        self._expired: OrderedDict[str, None] = OrderedDict()  # the latest expired lease ids
        self._next_seq = 0
        self._producers: dict[str, int] = {}
        self._size = 0
        self._versions: dict[int, int] = {}
        self._counts = {"accepted": 0, "rejected": 0, "dropped_stale": 0, "redelivered": 0, "acked": 0}

    async def start(self, consumer_groups: Sequence[str] = ()) -> None:
        return None  # one pool serves every consumer group: nothing to create

    async def close(self) -> None:
        return None

    def priority(self, item: _Item) -> float:
        value = item.record.min_version - self.decay * item.use_count
        if self.priority_fn == "decay_limit_randomization" and self.sigma:
            value += self._rng.gauss(0.0, self.sigma)
        return value

    def _keep(self, record: GroupRecord) -> None:
        self._items[self._next_seq] = _Item(self._next_seq, record)
        self._accepted_log.extend(record.uids)
        self._next_seq += 1

    def _count_accepted(self, n: int) -> None:
        self._counts["accepted"] += n

    def _remove(self, item: _Item) -> None:
        del self._items[item.seq]
        self._size -= item.record.n
        add_versions(self._versions, item.record.versions.items(), sign=-1)

    def _expire(self) -> None:
        now = self._clock_ms()
        for lease_id in [lid for lid, lease in self._leases.items() if 0 < lease.deadline_ms <= now]:
            for seq in self._leases.pop(lease_id).seqs:
                self._items[seq].leased = False
            self._expired[lease_id] = None
        while len(self._expired) > ACKED_IDS_KEPT:
            self._expired.popitem(last=False)

    def _payload(self, item: _Item) -> bytes:
        if item.use_count == 0:
            return item.record.payload
        msg = buffer_pb2.GetBatchResponse.FromString(item.record.payload)
        for exp in msg.experiences:
            exp.use_count = item.use_count
        return b"".join(encode_member(exp) for exp in msg.experiences)

    async def open_consumer(self, request: OpenRequest) -> OpenOutcome:
        consumer_group, consumer = request.consumer_group, request.consumer
        self._expire()
        epoch = self._epochs.get(consumer, 0) + 1
        self._epochs[consumer] = epoch
        acked = released = 0
        for lease_id in [lid for lid, lease in self._leases.items() if lease.consumer == consumer]:
            lease = self._leases[lease_id]
            if lease_id in request.keep_lease_ids:
                lease.epoch = epoch
            elif lease_id in request.ack_lease_ids:
                acked += await self.ack(consumer_group, lease_id, lease.epoch)
            else:
                released += await self.nack(consumer_group, lease_id, lease.epoch)
        return OpenOutcome(epoch=epoch, acked=acked, released=released)

    async def accepted_uids(self, start: int = 0, count: int = -1) -> list[str]:
        return self._accepted_log[start:] if count < 0 else self._accepted_log[start : start + count]

    async def lease(self, request: LeaseRequest) -> LeaseOutcome:
        consumer = request.consumer or "trainer"
        check_epoch(self._epochs.get(consumer, 0), request.epoch, request.consumer_group, consumer)
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
        deadline = 0 if request.epoch else now + request.lease_ms
        for item in taken:
            item.leased = True
        self._leases[lease_id] = _Lease(
            [i.seq for i in taken], total, deadline, consumer, request.epoch, taken_ms=self._clock_ms()
        )
        return LeaseOutcome(
            committed=True,
            lease_id=lease_id,
            payloads=[self._payload(i) for i in taken],
            n=total,
            deadline_ms=deadline,
            dropped_stale=dropped,
        )

    def _check_stale(self, group: str, consumer: str, epoch: int) -> None:
        if consumer:  # a lease already given back still fences its stale holder
            check_epoch(self._epochs.get(consumer, 0), epoch, group, consumer, must_be_open=False)

    def _take(self, group: str, lease_id: str, epoch: int) -> _Lease:
        self._expire()
        held = self._leases.get(lease_id)
        if held is not None and held.epoch != epoch:
            raise lease_epoch_error(lease_id, group, held.epoch, epoch)
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            raise lease_gone_error(lease_id, group, lease_id in self._expired)
        return lease

    async def ack(self, consumer_group: str, lease_id: str, epoch: int = 0, consumer: str = "") -> int:
        if lease_id in self._acked_leases:
            return self._acked_leases[lease_id]
        self._check_stale(consumer_group, consumer, epoch)
        lease = self._take(consumer_group, lease_id, epoch)
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

    async def nack(self, consumer_group: str, lease_id: str, epoch: int = 0, consumer: str = "") -> int:
        self._check_stale(consumer_group, consumer, epoch)
        lease = self._take(consumer_group, lease_id, epoch)
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
            oldest_lease_age_s=oldest_lease_age_s(
                (x.taken_ms for x in self._leases.values()), self._clock_ms()
            ),
            per_model_version=dict(self._versions),
            store=self.name,
            **self._counts,
        )
