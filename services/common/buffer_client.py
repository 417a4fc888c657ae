"""Client of the buffer service for producers (explorers) and consumers (trainers).

Producers put with `put(experiences)`: each call gets the next sequence number of this producer (they
keep increasing across restarts of the producer) and is sent with `PutSequenced`, retried on UNAVAILABLE/DEADLINE_EXCEEDED until it succeeds, so a retry after a
lost reply never stores twice. Consumers `get_batch(...)` (whole groups under a lease), train, then
`ack(lease_id)`; `nack` gives a batch back.
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

    async def get_batch(
        self, size: int, *, timeout_ms: int = 1000, min_model_version: int = 0, lease_ms: int = 0
    ) -> LeasedBatch:
        request = buffer_pb2.GetBatchRequest(
            consumer_group=self.consumer_group,
            consumer=self.consumer,
            size=size,
            timeout_ms=timeout_ms,
            min_model_version=min_model_version,
            lease_ms=lease_ms,
        )
        resp = await self.stub.GetBatch(
            request, timeout=self.timeout_s + timeout_ms / 1000, wait_for_ready=True
        )
        return LeasedBatch(
            lease_id=resp.lease_id,
            experiences=list(resp.experiences),
            partial=resp.partial,
            deadline_ms=resp.lease_deadline_ms,
            dropped_stale=resp.dropped_stale,
        )

    async def ack(self, lease_id: str) -> int:
        """Ack a lease (retried on transport failures; the buffer answers a repeated Ack the same way).
        Raises AioRpcError FAILED_PRECONDITION if the lease expired and its batch went back."""
        request = buffer_pb2.AckRequest(lease_id=lease_id, consumer_group=self.consumer_group)
        resp = await self._retrying(
            lambda: self.stub.Ack(request, timeout=self.timeout_s, wait_for_ready=True)
        )
        return resp.acked

    async def nack(self, lease_id: str) -> int:
        request = buffer_pb2.NackRequest(lease_id=lease_id, consumer_group=self.consumer_group)
        return (await self.stub.Nack(request, timeout=self.timeout_s, wait_for_ready=True)).returned

    async def stats(self) -> buffer_pb2.StatsResponse:
        request = buffer_pb2.StatsRequest(consumer_group=self.consumer_group)
        return await self.stub.Stats(request, timeout=self.timeout_s, wait_for_ready=True)
