"""Where an explorer's experiences go: the buffer service (`BufferSink`) or a list (`ListSink`).

Backpressure never loses data: when the buffer answers RESOURCE_EXHAUSTED (full, `on_full: reject`)
the sink waits with a growing back-off and sends the same experiences again, as long as it takes; a
buffer with `on_full: wait` simply holds the call. Transport failures are retried by the client with the
same sequence number (idempotent), so a retry never stores twice. Large steps go out in chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import grpc

from services.common.backoff import Backoff
from services.common.buffer_client import BufferClient
from services.common.experience import Experience
from services.common.log import get_logger

log = get_logger("explorer.sink")


@runtime_checkable
class ExperienceSink(Protocol):
    async def put(self, experiences: Sequence[Experience]) -> None: ...

    def stats(self) -> dict[str, float]: ...

    async def close(self) -> None: ...


class ListSink:
    """Keeps everything (tests, `explore` runs without a buffer)."""

    def __init__(self) -> None:
        self.experiences: list[Experience] = []

    async def put(self, experiences: Sequence[Experience]) -> None:
        self.experiences.extend(experiences)

    def stats(self) -> dict[str, float]:
        return {"sent": float(len(self.experiences))}

    async def close(self) -> None:
        pass


class BufferSink:
    def __init__(
        self,
        client: BufferClient,
        *,
        vocab_size: int = 0,
        max_batch_experiences: int = 1024,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
    ):
        self.client = client
        self.vocab_size = vocab_size
        self.max_batch_experiences = max_batch_experiences
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self._stats = {"sent": 0.0, "backpressure_waits": 0.0, "backpressure_seconds": 0.0}

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    async def put(self, experiences: Sequence[Experience]) -> None:
        for start in range(0, len(experiences), self.max_batch_experiences):
            await self._put_chunk(experiences[start : start + self.max_batch_experiences])

    async def _put_chunk(self, chunk: Sequence[Experience]) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(self.initial_backoff_s, self.max_backoff_s)
        while True:
            try:
                await self.client.put(chunk, vocab_size=self.vocab_size)
                self._stats["sent"] += len(chunk)
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                self._stats["backpressure_waits"] += 1
                log.info("buffer full; waiting", backoff_s=backoff.delay, experiences=len(chunk))
            t0 = loop.time()
            await backoff.wait()  # while the buffer is full (no event to wait on)
            self._stats["backpressure_seconds"] += loop.time() - t0

    async def close(self) -> None:
        pass
