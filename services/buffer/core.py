"""`BufferCore`: the buffer's logic on top of a `Store`, with no gRPC in sight.

It validates batches before anything is stored, applies the `on_full` policy (refuse with `BufferFull`,
or wait until trainers ack), and serves `get_batch` by asking the store for a full batch of whole groups
until `timeout_ms` runs out, then for whatever is there (`partial`). Waiters wake on any change made in
this process and poll the store every `poll_interval_s` for changes made elsewhere (another replica,
lease expiry), so the wait is bounded by the deadline, never by a sleep.

Consumer groups are declared (`BufferSettings.consumer_groups`, from `services.buffer.consumer_groups`)
and created by `start`; a call naming any other group is refused, so a stray name never makes a group
that would hold every experience back from retention. The empty name means `default`.

Every string and repeated field of a request is bounded before the store sees it (`check_text`, limits
from `services.common.rpc.bounds`: ids and names 128 characters, consumer group names 64, lease id lists
65536 entries), and error messages show a client's value through `shown` (64 characters and its length),
so no refusal grows with the input. These bounds are stated in `buffer.proto`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rft.v1 import experience_pb2

from services.buffer.records import (
    BufferFull,
    LeaseOutcome,
    LeaseRequest,
    OpenOutcome,
    OpenRequest,
    PutOutcome,
    StoreStats,
    ValidationError,
    group_records,
)
from services.buffer.settings import BufferSettings
from services.buffer.store import DEFAULT_CONSUMER_GROUP, Store
from services.buffer.validation import validate_batch
from services.common import progress
from services.common.rpc.bounds import MAX_ID_CHARS, list_problem, shown, text_problem

# Upper bound of GetBatch's `min_model_version`; see `check_min_model_version`.
MAX_MIN_MODEL_VERSION = 1 << 24
# Consumer group names are 1-64 characters (`services.buffer.consumer_groups` holds no longer one).
MAX_CONSUMER_GROUP_CHARS = 64


def check_min_model_version(value: int) -> None:
    """Refuse a `min_model_version` below 0 or above `MAX_MIN_MODEL_VERSION` (2^24 = 16,777,216).

    Every stored group older than `min_model_version` is dropped for good, so an absurd value (a
    bug, an unset int64 read as -1 and cast, 2^31, 2^62) silently empties the backlog. A bound relative
    to the stored data (the newest stored version + a margin) looks tighter but is wrong: the buffer does
    not know the trainer's current version (a restarted memory store knows no version at all), and right
    after a weight sync a trainer legitimately asks for versions no stored experience has yet (dropping
    the older ones is the staleness policy working). Model versions count weight syncs: 2^24 is a sync
    every second for six months, beyond any run, while 2^31 and other garbage are refused."""
    if not 0 <= value <= MAX_MIN_MODEL_VERSION:
        raise ValidationError(
            "min_model_version",
            f"{value} is out of range [0, {MAX_MIN_MODEL_VERSION}] (0 = no staleness bound; model versions "
            "count weight syncs, and every stored group older than this would be dropped)",
        )


def check_text(field: str, value: str, limit: int = MAX_ID_CHARS) -> None:
    """`ValidationError` naming `field` when `value` is over `limit` characters."""
    problem = text_problem(value, limit)
    if problem:
        raise ValidationError(field, problem)


def check_ids(field: str, values: list[str] | tuple[str, ...]) -> None:
    """`ValidationError` naming `field` (and the entry) for a list of lease ids over its bounds, or with an
    empty id."""
    problem = list_problem(values)
    if problem:
        raise ValidationError(field + problem[0], problem[1])
    if any(not lid for lid in values):
        raise ValidationError(field, "contains an empty lease id")


@dataclass
class Batch:
    """A leased batch: payloads are GetBatchResponse field-2 wire bytes, one per group."""

    lease_id: str
    payloads: list[bytes]
    n: int
    partial: bool
    deadline_ms: int
    dropped_stale: int


class BufferCore:
    """Validation, capacity policy, batching waits and leases over one store."""

    def __init__(self, store: Store, settings: BufferSettings | None = None):
        self.store = store
        self.settings = settings or BufferSettings()
        self._changed = asyncio.Event()
        self.consumer_groups: tuple[str, ...] = tuple(self.settings.consumer_groups)
        # puts and batch requests taken up: the step the buffer reports as its progress (liveness)
        self.handled = 0

    async def start(self) -> None:
        await self.store.start(self.consumer_groups)

    def _group(self, consumer_group: str) -> str:
        """The declared group a request names ("" = default); `ValidationError` for any other name."""
        check_text("consumer_group", consumer_group, MAX_CONSUMER_GROUP_CHARS)
        group = consumer_group or DEFAULT_CONSUMER_GROUP
        if group not in self.consumer_groups:
            raise ValidationError(
                "consumer_group",
                f"{shown(group)} is not declared; the declared consumer groups are "
                f"{', '.join(self.consumer_groups)} (services.buffer.consumer_groups)",
            )
        return group

    async def close(self) -> None:
        self._notify()
        await self.store.close()

    def _notify(self) -> None:
        """Wake every waiter: set the current event and start a fresh one for the next wait."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, event: asyncio.Event, timeout_s: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                event.wait(), timeout=max(0.0, min(timeout_s, self.settings.poll_interval_s))
            )

    async def put(
        self,
        batch: experience_pb2.ExperienceBatch,
        *,
        sequence: int = 0,
        idempotent: bool = False,
        wire: list[bytes] | None = None,
        wire_bytes: int | None = None,
    ) -> PutOutcome:
        """Validate and store a batch whole; raise `ValidationError` or (on_full=reject) `BufferFull`.

        `wire`: each experience's bytes as received (see `WireBatch`), stored without re-serializing;
        `wire_bytes`: the size of the batch as received."""
        self.handled += 1
        try:
            validate_batch(batch, self.settings.limits, wire_bytes, wire)
            check_text("batch.producer_id" if idempotent else "producer_id", batch.producer_id)
            if idempotent and not batch.producer_id:
                raise ValidationError("batch.producer_id", "required for sequenced puts")
            if idempotent and sequence <= 0:
                raise ValidationError("sequence", f"{sequence} must be > 0")
        except ValidationError:
            await self.store.count_rejected(len(batch.experiences))
            raise
        records = group_records(batch.experiences, wire)
        total = sum(r.n for r in records)
        if total > self.store.capacity:
            await self.store.count_rejected(total)
            raise BufferFull(f"batch of {total} experiences exceeds capacity {self.store.capacity}")
        producer = batch.producer_id if idempotent else ""
        while True:
            event = self._changed
            try:
                with progress.work("buffer commit"):  # services/common/progress.py
                    outcome = await self.store.put(records, producer=producer, sequence=sequence)
            except BufferFull:
                if self.settings.on_full != "wait":
                    raise
                await self._wait_change(event, self.settings.poll_interval_s)
                continue
            if outcome.stored:
                self._notify()
            return outcome

    async def get_batch(
        self,
        *,
        size: int,
        timeout_ms: int = 0,
        consumer_group: str = "",
        consumer: str = "",
        min_model_version: int = 0,
        lease_ms: int = 0,
        epoch: int = 0,
    ) -> Batch:
        self.handled += 1
        if size <= 0:
            raise ValidationError("size", f"{size} must be > 0")
        if timeout_ms < 0:
            raise ValidationError("timeout_ms", f"{timeout_ms} must be >= 0")
        if lease_ms < 0:
            raise ValidationError("lease_ms", f"{lease_ms} must be >= 0 (0 = server default)")
        if epoch < 0:
            raise ValidationError("epoch", f"{epoch} must be >= 0 (0 = unfenced)")
        check_min_model_version(min_model_version)
        group = self._group(consumer_group)
        check_text("consumer", consumer)
        wait_s = min(timeout_ms / 1000.0, self.settings.max_read_timeout_s)
        deadline = time.monotonic() + wait_s
        dropped = 0
        while True:
            event = self._changed
            remaining = deadline - time.monotonic()
            request = LeaseRequest(
                consumer_group=group,
                consumer=consumer,
                size=size,
                min_model_version=min_model_version,
                lease_ms=lease_ms or self.settings.lease_ms,
                allow_partial=remaining <= 0,
                epoch=epoch,
            )
            outcome: LeaseOutcome = await self.store.lease(request)
            dropped += outcome.dropped_stale
            if outcome.committed:
                if outcome.dropped_stale:
                    self._notify()  # dropping freed room for waiting producers
                return Batch(
                    lease_id=outcome.lease_id,
                    payloads=outcome.payloads,
                    n=outcome.n,
                    partial=outcome.n < size,
                    deadline_ms=outcome.deadline_ms,
                    dropped_stale=dropped,
                )
            if remaining <= 0:
                return Batch(
                    lease_id="", payloads=[], n=0, partial=True, deadline_ms=0, dropped_stale=dropped
                )
            await self._wait_change(event, remaining)

    async def ack(self, lease_id: str, consumer_group: str = "", epoch: int = 0, consumer: str = "") -> int:
        return await self._settle(self.store.ack, lease_id, consumer_group, epoch, consumer)

    async def nack(self, lease_id: str, consumer_group: str = "", epoch: int = 0, consumer: str = "") -> int:
        return await self._settle(self.store.nack, lease_id, consumer_group, epoch, consumer)

    async def _settle(
        self,
        settle: Callable[[str, str, int, str], Awaitable[int]],
        lease_id: str,
        consumer_group: str,
        epoch: int,
        consumer: str,
    ) -> int:
        """Ack or nack (`settle`, the store's) after checking the request's fields."""
        if not lease_id:
            raise ValidationError("lease_id", "empty")
        check_text("lease_id", lease_id)
        check_text("consumer", consumer)
        if epoch < 0:
            raise ValidationError("epoch", f"{epoch} must be >= 0 (0 = unfenced)")
        n = await settle(self._group(consumer_group), lease_id, epoch, consumer)
        self._notify()
        return n

    async def open_consumer(
        self,
        consumer_group: str = "",
        consumer: str = "",
        ack_lease_ids: list[str] | tuple[str, ...] = (),
        keep_lease_ids: list[str] | tuple[str, ...] = (),
    ) -> OpenOutcome:
        """A consumer (re)starts: see `Store.open_consumer`."""
        if not consumer:
            raise ValidationError("consumer", "empty: a fenced consumer needs a stable name")
        check_text("consumer", consumer)
        for name, ids in (("ack_lease_ids", ack_lease_ids), ("keep_lease_ids", keep_lease_ids)):
            check_ids(name, ids)
        if set(ack_lease_ids) & set(keep_lease_ids):
            raise ValidationError("keep_lease_ids", "names a lease that ack_lease_ids acks")
        outcome = await self.store.open_consumer(
            OpenRequest(self._group(consumer_group), consumer, list(ack_lease_ids), list(keep_lease_ids))
        )
        self._notify()
        return outcome

    async def stats(self, consumer_group: str = "") -> StoreStats:
        return await self.store.stats(self._group(consumer_group))
