"""The memory method's store: the latest published version as the chunk bytes the trainer pushed.

A push is validated as it streams (`PushAssembly`: one version, indices 0..total-1 in order, the
byte count equal to `total_bytes`) and becomes visible only on `finish()`: a stream that breaks,
is cancelled or is inconsistent leaves the store and `model_version` as they were. Chunks are kept
as received - serialized `rft.v1.WeightChunk` messages - so each pull streams the same bytes with no
decoding or re-encoding; only the latest version is kept (a pull in flight holds its own reference).

Delta pulls (`WeightDeltas`): a receiver that names the version it holds (`have_version`) gets the
delta from it to the latest (`services.weight_sync.wire.delta`) when that version is among the
last `keep` versions pulled (default 3: the latest and the 2 before) and the delta is smaller than
the payload; else the full payload. A delta is computed once per (base, latest) pair, in a thread,
and cached until a newer version is pulled, so the synchronizer's CPU per version does not grow with
the number of explorers. Memory: up to `keep` versions' chunks (each the payload's size; the latest
is the store's own) plus, per kept base, one cached delta (a few % of the payload at a realistic
change per step); computing one joins the two payloads transiently (2x the payload).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from services.common.log import get_logger
from services.weight_sync import MissingChunkError
from services.weight_sync.wire.chunks import DEFAULT_CHUNK_BYTES, StreamCheck, parse_raw_chunk, split_chunks
from services.weight_sync.wire.delta import make_delta, read_delta_header

log = get_logger("synchronizer.weights")


@dataclass(frozen=True)
class StoredWeights:
    version: int
    step: int
    chunks: tuple[bytes, ...]  # serialized rft.v1.WeightChunk messages, in order
    total_bytes: int


class PushAssembly:
    """Collects one pushed stream; `add` checks each chunk's header (`StreamCheck`, as every receiver
    of a chunk stream does), `finish` checks completeness."""

    def __init__(self) -> None:
        self.check = StreamCheck()
        self._chunks: list[bytes] = []

    @property
    def total_bytes(self) -> int:
        return self.check.total_bytes

    def add(
        self, *, version: int, step: int, index: int, total: int, total_bytes: int, nbytes: int, raw: bytes
    ) -> None:
        self.check.add(
            version=version, step=step, index=index, total=total, total_bytes=total_bytes, nbytes=nbytes
        )
        self._chunks.append(raw)

    def finish(self) -> StoredWeights:
        c = self.check
        if c.count == 0:
            raise MissingChunkError("empty push: no chunk arrived")
        if not c.complete:
            raise MissingChunkError(
                f"version {c.version}: stream ended after {c.count} of {c.total} chunks "
                f"({c.received} of {c.total_bytes} bytes)"
            )
        return StoredWeights(c.version, c.step, tuple(self._chunks), c.total_bytes)


def _payload(stored: StoredWeights) -> bytes:
    return b"".join(parse_raw_chunk(raw).data for raw in stored.chunks)


def _delta_chunks(base: StoredWeights, target: StoredWeights, max_ratio: float) -> tuple[bytes, ...] | None:
    """The serialized chunks of the delta from `base` to `target`, or None (headers differ, or too big)."""
    if base.total_bytes != target.total_bytes:
        return None  # not the same tensors: no need to join the payloads to see it
    first = parse_raw_chunk(target.chunks[0])
    delta = make_delta(_payload(base), _payload(target), base.version, target.version)
    if delta is not None:
        log.info(
            "weight delta", base=base.version, version=target.version, payload_bytes=target.total_bytes,
            delta_bytes=len(delta), changed_fraction=round(read_delta_header(delta).changed_fraction(), 6),
        )  # fmt: skip
    if delta is None or len(delta) >= max_ratio * target.total_bytes:
        return None
    chunk_bytes = max(len(first.data), 64 << 10) if target.total_bytes else DEFAULT_CHUNK_BYTES
    chunks = split_chunks(delta, first.version, chunk_bytes=chunk_bytes, delta_base=base.version)
    return tuple(c.SerializeToString() for c in chunks)


class WeightDeltas:
    """The last `keep` versions pulled and the deltas from each to the latest (see the module docstring).

    `chunks_for(latest, have_version)` answers the chunks to stream for one pull and counts the bytes
    served full and as deltas. Deltas of superseded targets are dropped as a newer version arrives.
    """

    def __init__(self, keep: int = 3, max_ratio: float = 0.9):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep, self.max_ratio = keep, max_ratio
        self._kept: OrderedDict[int, StoredWeights] = OrderedDict()
        self._deltas: dict[tuple[int, int], asyncio.Task[tuple[bytes, ...] | None]] = {}
        self.bytes_full = self.bytes_delta = self.deltas_computed = 0

    def _observe(self, latest: StoredWeights) -> None:
        if self._kept.get(latest.version) is latest:
            return
        self._kept.pop(latest.version, None)  # a version pushed again (trainer restart): the new bytes
        self._kept[latest.version] = latest
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)
        for key in [k for k in self._deltas if k[1] != latest.version or k[0] not in self._kept]:
            del self._deltas[key]  # a pull awaiting it keeps its own reference

    async def chunks_for(
        self, latest: StoredWeights, have_version: int | None
    ) -> tuple[tuple[bytes, ...], bool]:
        """(the chunks to stream, whether they are a delta) for a receiver holding `have_version`."""
        self._observe(latest)
        chunks = None
        base = self._kept.get(have_version) if have_version is not None else None
        if base is not None:
            key = (base.version, latest.version)
            task = self._deltas.get(key)
            if task is None:
                task = asyncio.ensure_future(asyncio.to_thread(_delta_chunks, base, latest, self.max_ratio))
                self._deltas[key] = task
                task.add_done_callback(lambda t, key=key: self._computed(key, t))
            try:
                chunks = await asyncio.shield(task)
            except Exception:  # noqa: BLE001 - logged in `_computed`; this pull gets the full payload
                chunks = None
        if chunks is None:
            self.bytes_full += latest.total_bytes
            return latest.chunks, False
        self.bytes_delta += parse_raw_chunk(chunks[0]).total_bytes
        return chunks, True

    def _computed(self, key: tuple[int, int], task: asyncio.Task) -> None:
        self.deltas_computed += 1
        if task.cancelled() or task.exception() is not None:
            self._deltas.pop(key, None)  # not cached: the next pull tries again
            error = "cancelled" if task.cancelled() else repr(task.exception())
            log.warning("weight delta failed", base=key[0], version=key[1], error=error)
            return
        if task.result() is None:
            log.info("weight delta not used: full payload", base=key[0], version=key[1])
