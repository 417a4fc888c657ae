"""The explorer's side of weight sync, over the shared transport layer (`services.weight_sync`).

- Broadcast (`nccl` on CUDA, `gloo` on CPU): `setup(info, rank_offset)` joins the group with one rank
  per rollout worker (an `hf` engine is one worker: rank_offset + i); `receive(version)` takes the next
  broadcast and loads it into every engine as it streams in; `abandon()` (any thread) makes a
  receive in progress give up (the synchronizer called the broadcast off); `teardown(generation)` leaves.
  An engine that manages its own workers (vLLM) provides `join_weight_group(info, rank_offset, abandon)
  -> ranks`, `receive_weights(version)`, `abandon_weights()` and `leave_weight_group()`; it is used
  instead, and carries a join's `abandon` and the receive's abandon to its workers itself.
- Memory: `load_chunks(chunks)` decodes a complete safetensors chunk stream and loads it.
Joins and receives block in collectives, so they run in worker threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterable, Sequence
from typing import Any

from rft.v1 import common_pb2

from services.common.log import get_logger
from services.explorer.core import ExplorerCore
from services.weight_sync import (
    BroadcastGroup,
    GroupInfo,
    StaleGenerationError,
    chunks_to_state_dict,
)

log = get_logger("explorer.weights")


class WeightReceiver:
    def __init__(self, core: ExplorerCore):
        self.core = core
        self._groups: list[BroadcastGroup | None] = []
        self.generation: int | None = None
        self._specs: tuple = ()
        self._lock = asyncio.Lock()

    @property
    def engines(self) -> Sequence[Any]:
        return self.core.engines

    async def setup(
        self, info: GroupInfo, rank_offset: int, abandon: threading.Event | None = None
    ) -> list[int]:
        async with self._lock:
            await self._leave()
            ranks: list[int] = []
            joins = []
            next_rank = rank_offset
            for engine in self.engines:
                if hasattr(engine, "join_weight_group"):
                    joins.append(engine.join_weight_group(info, next_rank, abandon))
                    next_rank += int(getattr(engine, "workers", 1))
                else:
                    joins.append(
                        asyncio.to_thread(BroadcastGroup.join, info, next_rank, _device(engine), abandon)
                    )
                    next_rank += 1
            results = await asyncio.gather(*joins)
            self._groups = []
            for result in results:
                if isinstance(result, BroadcastGroup):
                    self._groups.append(result)
                    ranks.append(result.rank)
                else:
                    self._groups.append(None)
                    ranks.extend(result)
            self.generation, self._specs = info.generation, info.specs
            log.info("joined weight-sync group", generation=info.generation, ranks=ranks)
            return ranks

    async def receive(self, version: int) -> int:
        """Receive and load the next broadcast; returns the version loaded."""
        async with self._lock:
            if not self._groups:
                raise StaleGenerationError("no weight-sync group joined; call SetupWeightSyncGroup first")
            self.core.status = "SYNCING"

            async def one(engine: Any, group: BroadcastGroup | None) -> None:
                if group is None:
                    await engine.receive_weights(version)
                else:
                    stream = await asyncio.to_thread(group.receive, version)
                    await engine.load_weights(stream, version)

            try:
                await asyncio.gather(*(one(e, g) for e, g in zip(self.engines, self._groups, strict=True)))
            finally:
                self.core.status = "RUNNING"
            self.core.gate.notify_version(version)
            await self.core.weights_loaded(version, [spec.name for spec in self._specs])
            return self.core.model_version

    def abandon(self) -> None:
        """Give up the receive in progress: each group's wait raises `StaleGenerationError` within a
        second (`BroadcastGroup.abandon`); an engine with its own workers (vLLM) tells them
        (`abandon_weights`)."""
        for engine, group in zip(self.engines, self._groups, strict=False):
            if group is not None:
                group.abandon()
            elif hasattr(engine, "abandon_weights"):
                engine.abandon_weights()

    async def load_chunks(
        self, chunks: AsyncIterable[common_pb2.WeightChunk]
    ) -> tuple[common_pb2.ModelVersion, int]:
        """Load one complete chunk stream (memory sync); returns its version and payload bytes."""
        received = [c async for c in chunks]
        version, state_dict = await asyncio.to_thread(chunks_to_state_dict, received)
        await self.core.load_weights(state_dict.items(), int(version.version))
        return version, sum(len(c.data) for c in received)

    async def teardown(self, generation: int) -> bool:
        async with self._lock:
            if generation and self.generation is not None and generation != self.generation:
                return False
            await self._leave()
            return True

    async def _leave(self) -> None:
        for engine, group in zip(self.engines, self._groups, strict=False):
            if group is not None:
                group.close()
            elif hasattr(engine, "leave_weight_group"):
                await engine.leave_weight_group()
        self._groups = []
        self.generation = None


def _device(engine: Any) -> str:
    model = getattr(engine, "model", None)
    if model is None:
        return "cpu"
    return str(next(model.parameters()).device)
