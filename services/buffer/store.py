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
  Acking an unknown or expired lease raises `LeaseError`, so an experience is acked at most once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from services.buffer.records import GroupRecord, LeaseOutcome, LeaseRequest, PutOutcome, StoreStats
from services.common.registry import Registry


@runtime_checkable
class Store(Protocol):
    name: str
    capacity: int

    async def start(self) -> None:
        """Connect and recover state (a Redis store finds leases left by a previous process)."""

    async def close(self) -> None: ...

    async def put(
        self, groups: Sequence[GroupRecord], *, producer: str = "", sequence: int = 0
    ) -> PutOutcome:
        """Store all groups or none; raises `BufferFull` if they do not fit."""

    async def lease(self, request: LeaseRequest) -> LeaseOutcome: ...

    async def ack(self, consumer_group: str, lease_id: str) -> int:
        """Remove the lease's experiences for good; returns how many. Raises `LeaseError`."""

    async def nack(self, consumer_group: str, lease_id: str) -> int:
        """Give the lease's experiences back for redelivery; returns how many. Raises `LeaseError`."""

    async def count_rejected(self, n: int) -> None: ...

    async def stats(self, consumer_group: str) -> StoreStats: ...


# name -> factory(endpoint: BufferEndpoint, buffer: ExperienceBufferConfig) -> Store
STORES: Registry = Registry("buffer store")
