"""Client of the buffer service for producers (explorers) and consumers (trainers).

Producers put with `put(experiences)`: each call gets the next sequence number of this producer (they
keep increasing across restarts of the producer) and is sent with `PutSequenced`, retried on UNAVAILABLE/DEADLINE_EXCEEDED until it succeeds, so a retry after a
lost reply never stores twice. Consumers `get_batch(...)` (whole groups under a lease), train, then
`ack(lease_id)`; `nack` gives a batch back. A fenced consumer (a trainer) first calls
`open_consumer(ack_lease_ids)`: its epoch then travels with every GetBatch/Ack/Nack, its leases never
expire, and a newer holder of the same consumer name fences it (FAILED_PRECONDITION). A buffer that
no longer knows the epoch (a memory store that restarted: NOT_FOUND) is opened again by `get_batch`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from rft.v1 import buffer_pb2, buffer_pb2_grpc, experience_pb2

from services.common.experience import Experience, batch_to_proto, from_proto

T = TypeVar("T")


class LeaseUnknown(RuntimeError):
    """Ack of a lease the buffer does not know (already settled elsewhere, or a store that restarted)."""


class ConsumerFenced(RuntimeError):
    """A newer consumer of the same name took over (OpenConsumer); this one must stop."""


RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass
class LeasedBatch:
    lease_id: str
    experiences: list[experience_pb2.Experience]
    partial: bool
    deadline_ms: int
    dropped_stale: int

    def decoded(self) -> list[Experience]:
        return [from_proto(e) for e in self.experiences]


class BufferClient:
    """Thin async wrapper over `BufferServiceStub` on an existing channel (see `create_channel`)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        producer_id: str = "",
        consumer_group: str = "",
        consumer: str = "",
        timeout_s: float = 30.0,
        retry_deadline_s: float = 300.0,
    ):
        self.stub = buffer_pb2_grpc.BufferServiceStub(channel)
        self.producer_id = producer_id
        self.consumer_group = consumer_group
        self.consumer = consumer
        self.timeout_s = timeout_s
        self.retry_deadline_s = retry_deadline_s
        self.epoch = 0  # from open_consumer; 0 = unfenced
        self._held: set[str] = set()  # leases this fenced consumer holds (kept when it re-opens)
        # Sequences must increase across restarts of a producer too (a Redis store remembers the last
        # one it stored per producer id): start at the wall clock in microseconds, then count up.
        self._sequence = time.time_ns() // 1000

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run an idempotent call, retrying UNAVAILABLE / DEADLINE_EXCEEDED until `retry_deadline_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_deadline_s
        backoff = 0.05
        while True:
            try:
                return await call()
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE or loop.time() + backoff > deadline:
                    raise
            await asyncio.sleep(backoff)  # ok-sleep: retry backoff after a transport failure
            backoff = min(backoff * 2, 1.0)

    async def put_proto(self, batch: experience_pb2.ExperienceBatch) -> buffer_pb2.PutResponse:
        """Store a batch exactly once, retrying transport failures with the same sequence number."""
        if not self.producer_id:
            raise ValueError("BufferClient needs a producer_id to put")
        batch.producer_id = self.producer_id
        self._sequence += 1
        request = buffer_pb2.SequencedBatch(batch=batch, sequence=self._sequence)
        return await self._retrying(
            lambda: self.stub.PutSequenced(request, timeout=self.timeout_s, wait_for_ready=True)
        )

    async def put(self, experiences: Sequence[Experience], vocab_size: int = 0) -> buffer_pb2.PutResponse:
        return await self.put_proto(batch_to_proto(experiences, vocab_size=vocab_size))

    async def open_consumer(
        self, ack_lease_ids: Sequence[str] = (), keep_lease_ids: Sequence[str] = ()
    ) -> buffer_pb2.OpenConsumerResponse:
        """Take over this consumer name (fencing older holders): ack `ack_lease_ids`, keep
        `keep_lease_ids` held, release the rest."""
        if not self.consumer:
            raise ValueError("BufferClient needs a consumer name to open a fenced consumer")
        request = buffer_pb2.OpenConsumerRequest(
            consumer_group=self.consumer_group,
            consumer=self.consumer,
            ack_lease_ids=list(ack_lease_ids),
            keep_lease_ids=list(keep_lease_ids),
        )
        resp = await self._retrying(
            lambda: self.stub.OpenConsumer(request, timeout=self.timeout_s, wait_for_ready=True)
        )
        self.epoch = resp.epoch
        return resp

    async def get_batch(
        self, size: int, *, timeout_ms: int = 1000, min_model_version: int = 0, lease_ms: int = 0
    ) -> LeasedBatch:
        """Lease whole groups. A fenced consumer whose call failed in transport (the buffer died with
        the reply in flight: a lease may have been made) opens again keeping the leases it holds, so
        that lost lease comes back, then asks again (until `retry_deadline_s`); an unfenced one asks
        again (its lost lease expires). gRPC itself never retries GetBatch (`rpc.client.NOT_RETRIED`)."""

        def request() -> buffer_pb2.GetBatchRequest:
            return buffer_pb2.GetBatchRequest(
                consumer_group=self.consumer_group,
                consumer=self.consumer,
                size=size,
                timeout_ms=timeout_ms,
                min_model_version=min_model_version,
                lease_ms=lease_ms,
                epoch=self.epoch,
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_deadline_s
        timeout = self.timeout_s + timeout_ms / 1000
        while True:
            try:
                resp = await self.stub.GetBatch(request(), timeout=timeout, wait_for_ready=True)
                break
            except grpc.aio.AioRpcError as exc:
                if not self.epoch:  # an unfenced lease whose reply was lost expires with its deadline
                    if exc.code() in RETRYABLE and loop.time() < deadline:
                        await asyncio.sleep(0.1)  # ok-sleep: retry backoff after a transport failure
                        continue
                    raise
                if exc.code() == grpc.StatusCode.NOT_FOUND:  # the buffer lost its state (memory store)
                    await self.open_consumer()
                    self._held.clear()
                elif exc.code() in RETRYABLE and loop.time() < deadline:
                    await self.open_consumer(keep_lease_ids=sorted(self._held))
                else:
                    _raise_domain(exc)
                    raise
        if resp.lease_id:
            self._held.add(resp.lease_id)
        return LeasedBatch(
            lease_id=resp.lease_id,
            experiences=list(resp.experiences),
            partial=resp.partial,
            deadline_ms=resp.lease_deadline_ms,
            dropped_stale=resp.dropped_stale,
        )

    async def _settle(self, lease_id: str, ack: bool) -> int:
        """Ack or nack, retried on transport failures (the buffer answers a repeated Ack the same way)
        and once more when this client re-opened with a new epoch while the call was in flight."""
        while True:
            epoch = self.epoch
            kind = buffer_pb2.AckRequest if ack else buffer_pb2.NackRequest
            request = kind(
                lease_id=lease_id, consumer_group=self.consumer_group, epoch=epoch, consumer=self.consumer
            )
            method = self.stub.Ack if ack else self.stub.Nack
            try:
                resp = await self._retrying(
                    lambda m=method, r=request: m(r, timeout=self.timeout_s, wait_for_ready=True)
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.ABORTED and epoch != self.epoch:
                    continue  # re-opened meanwhile: the lease moved to the new epoch
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    self._held.discard(lease_id)
                _raise_domain(exc)
                raise
            self._held.discard(lease_id)
            return resp.acked if ack else resp.returned

    async def ack(self, lease_id: str) -> int:
        """Ack a lease. Raises `LeaseUnknown` if the lease expired (its batch went back) or the buffer
        does not know it, `ConsumerFenced` if a newer consumer took this one over."""
        return await self._settle(lease_id, ack=True)

    async def nack(self, lease_id: str) -> int:
        return await self._settle(lease_id, ack=False)

    async def stats(self) -> buffer_pb2.StatsResponse:
        request = buffer_pb2.StatsRequest(consumer_group=self.consumer_group)
        return await self.stub.Stats(request, timeout=self.timeout_s, wait_for_ready=True)


def _raise_domain(exc: grpc.aio.AioRpcError) -> None:
    if exc.code() == grpc.StatusCode.ABORTED:
        raise ConsumerFenced(exc.details()) from exc
    if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
        raise LeaseUnknown(exc.details()) from exc
