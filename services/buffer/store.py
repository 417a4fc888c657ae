"""The `Store` protocol every buffer store implements, and the registry that picks one by name.

A store keeps group records and leases with these semantics, which the shared contract tests check on
every implementation:

- `put` stores all groups of a batch or none (capacity is checked first, atomically); a repeated
  `(producer, sequence)` is a duplicate and stores nothing.
- A consumer group sees every stored group once. `lease` hands out whole groups in store order
  (redeliveries first), at most `size` experiences (a single group larger than `size` goes alone),
  dropping and counting groups older than `min_model_version`. Without `allow_partial` it leases only
  a full batch. Leases carry an id and a deadline.
- `ack` removes a lease's groups for good; `nack` or an expired deadline makes them available again.
  Acking an unknown or expired lease raises `LeaseError` (whose message says it expired when it did), so
  an experience is acked at most once; acking an acked lease again answers its count again.
- Fencing: `open_consumer` bumps a consumer's epoch, acks the named leases it holds and queues its
  other leases for redelivery at once (a restarted trainer takes over, never waiting out a deadline).
  A lease taken with an epoch has no deadline; a call with a stale (older) epoch raises `FencedError`,
  one with an epoch the store never handed out (none yet, or newer than the current one)
  `ConsumerNotOpen` (`records.check_epoch`).
- Every accepted experience's uid is appended to the accepted log (`accepted_uids`), atomically with
  the put, for lineage audits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from services.buffer.records import (
    GroupRecord,
    LeaseOutcome,
    LeaseRequest,
    OpenOutcome,
    OpenRequest,
    PutOutcome,
    StoreStats,
)
from services.common.registry import Registry

# The consumer group of a request that names none (the empty string).
DEFAULT_CONSUMER_GROUP = "default"


@runtime_checkable
class Store(Protocol):
    name: str
    capacity: int

    async def start(self, consumer_groups: Sequence[str] = (DEFAULT_CONSUMER_GROUP,)) -> None:
        """Connect, create the declared `consumer_groups` (existing ones keep their state), and recover
        state (a Redis store finds leases left by a previous process). Only here are groups created:
        a group sees every stored experience and retention waits for it, so a stray name must not make one."""

    async def close(self) -> None: ...

    async def put(
        self, groups: Sequence[GroupRecord], *, producer: str = "", sequence: int = 0
    ) -> PutOutcome:
        """Store all groups or none; raises `BufferFull` if they do not fit."""

    async def lease(self, request: LeaseRequest) -> LeaseOutcome: ...

    async def ack(self, consumer_group: str, lease_id: str, epoch: int = 0, consumer: str = "") -> int:
        """Remove the lease's experiences for good; returns how many. Raises `LeaseError`."""

    async def nack(self, consumer_group: str, lease_id: str, epoch: int = 0, consumer: str = "") -> int:
        """Give the lease's experiences back for redelivery; returns how many. Raises `LeaseError`."""

    async def open_consumer(self, request: OpenRequest) -> OpenOutcome:
        """Fence older holders of `request.consumer`, ack its `ack_lease_ids`, keep its `keep_lease_ids`
        under the new epoch, requeue its other leases."""

    async def accepted_uids(self, start: int = 0, count: int = -1) -> list[str]:
        """The accepted log from `start` (`count` -1: to the end)."""

    async def count_rejected(self, n: int) -> None: ...

    async def stats(self, consumer_group: str) -> StoreStats: ...


# name -> factory(endpoint: BufferEndpoint, buffer: ExperienceBufferConfig) -> Store
STORES: Registry = Registry("buffer store")
