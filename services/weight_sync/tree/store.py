"""The memory method's relay: an explorer passes each weight version on to its children as it arrives.

A `RelayStore` holds, per version, a `VersionStream`: the serialized `rft.v1.WeightChunk`s received
so far (the bytes the trainer cut, never re-encoded) and an `asyncio.Condition` that wakes readers
when one more arrives. `pull_version` fills a stream from the first of a chain of sources that works
(the member's parent, grandparent, ..., the synchronizer: `fanout.plan_tree`); while it fills, any
number of readers (`VersionStream.follow`, what the relay's `PullWeights` streams to its children)
get each chunk as soon as it is appended. So a version goes down a tree of depth d in about the time
of one transfer plus d chunk-hops, not d transfers.

Deltas. A relay that holds a version asks its sources for the next one as a delta from it (`have`,
`PullWeightsRequest.have_version`, as an explorer without fan-out does): the synchronizer computes
each (held, latest) delta once, and relays pass the delta chunks on unchanged, so in a run where the
explorers hold the same version every hop carries the delta, not the payload. A stream is either a
full payload or a delta from one base (`VersionStream.base`); a child is served a delta only when it
holds that base (else NOT_FOUND: it goes on along its chain, up to the synchronizer, which answers
with a delta from what the child holds, or in full). Applying a delta is the receiver's business
(`SyncClient.decode_raw`: to its held payload, checked by the crc32 of every tensor).

Checks. Every chunk is checked before it is appended (`ChunkCheck`: one version, indices 0..total-1
in order, the bytes within `total_bytes`, one kind throughout - full, or a delta from the base the
puller asked for), so a relay never forwards a bad chunk; a stream is complete only when all `total`
chunks and exactly `total_bytes` bytes are in, and only a complete stream is loaded
(`VersionStream.complete`). A receiver still joins and checks what it got (`join_raw_chunks`), and the
delta's crc32s apply as usual.

Failure. A source that errors (its process died: UNAVAILABLE), sends nothing for `stall_s` seconds,
answers NOT_FOUND (it does not hold the version) or sends an inconsistent chunk is dropped and the
next source in the chain is asked for the same version; its stream starts again at chunk 0 and the
chunks already held are compared with it and skipped (the same version is the same bytes everywhere:
relays never re-encode), so readers downstream see one unbroken stream. When every source failed the
stream fails: readers get `RelayBroken` and go on along their own chain. Late joiners: the newest
complete version is kept (with any newer one being received); older ones are dropped as a newer one
completes (a reader in flight keeps its own reference).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from services.common.log import get_logger
from services.weight_sync.errors import MissingChunkError, WeightSyncError
from services.weight_sync.wire.chunks import StreamCheck, parse_raw_chunk

log = get_logger("weight_sync.relay")

# opens a PullWeights stream of one version (raw chunks), asking for a delta from `have` when not None
Source = Callable[[int, "int | None"], AsyncIterator[bytes]]


class RelayBroken(WeightSyncError):
    """The version's stream failed at this relay (every source failed): pull it from another."""


class VersionNotHeld(WeightSyncError, LookupError):
    """The relay neither holds nor is receiving the version asked for."""


def _kind(base: int | None) -> str:
    return "a full payload" if base is None else f"a delta from version {base}"


@dataclass
class ChunkCheck(StreamCheck):
    """`StreamCheck` over raw chunks (as the synchronizer's `PushAssembly` checks a push): with
    `expect`, no chunk of another version; every chunk of one kind, the first one's (`base`: None for
    a full payload, else the version the delta is from), and a delta only from `have`."""

    expect: int = 0  # the version the stream must carry (0 = any)
    have: int | None = None  # the version the puller holds: the only base a delta may have
    base: int | None = None  # what the first chunk said (None: a full payload)

    def add(self, raw: bytes) -> None:  # type: ignore[override]
        c = parse_raw_chunk(raw)
        base = c.delta_base_version if c.delta else None
        if self.count == 0 and base is not None and base != self.have:
            raise MissingChunkError(f"chunk 0 is a delta from version {base}, the puller holds {self.have}")
        if self.count and base != self.base:
            raise MissingChunkError(
                f"chunk {c.index} is {_kind(base)}, the stream's chunk 0 was {_kind(self.base)}"
            )
        if self.count == 0:
            self.base = base
        if self.expect and c.version.version != self.expect:
            raise MissingChunkError(
                f"asked for version {self.expect}, chunk {c.index} is of version {c.version.version}"
            )
        super().add(
            version=c.version.version, step=c.version.step, index=c.index, total=c.total,
            total_bytes=c.total_bytes, nbytes=len(c.data),
        )  # fmt: skip


@dataclass(eq=False)
class VersionStream:
    """One version's chunks as they arrive; readers follow it with `follow()`."""

    version: int
    have: int | None = None  # the version the filler held when it asked (a delta may come from it)
    chunks: list[bytes] = field(default_factory=list)
    check: ChunkCheck = field(init=False)
    error: str | None = None
    done: bool = False
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def __post_init__(self) -> None:
        self.check = ChunkCheck(expect=self.version, have=self.have)

    @property
    def base(self) -> int | None:
        """None: a full payload (or nothing yet); else the version this stream is a delta from."""
        return self.check.base

    @property
    def complete(self) -> bool:
        return self.done and self.error is None

    async def wait_done(self) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.done)

    async def append(self, raw: bytes) -> None:
        self.check.add(raw)
        async with self.changed:
            self.chunks.append(raw)
            self.changed.notify_all()

    async def finish(self, error: str | None = None) -> None:
        if error is None and not self.check.complete:
            c = self.check
            error = f"version {self.version}: stream ended after {c.count} of {c.total} chunks ({c.received} of {c.total_bytes} bytes)"  # fmt: skip
        async with self.changed:
            self.done, self.error = True, error
            self.changed.notify_all()

    async def follow(self) -> AsyncIterator[bytes]:
        """Every chunk, from the first, as it arrives; raises `RelayBroken` if the stream failed."""
        i = 0
        while True:
            async with self.changed:
                await self.changed.wait_for(lambda i=i: len(self.chunks) > i or self.done)
                ready, done, error = self.chunks[i:], self.done, self.error
            for raw in ready:
                yield raw
            i += len(ready)
            if done and i >= len(self.chunks):
                if error is not None:
                    raise RelayBroken(error)
                return


class RelayStore:
    """The versions this relay holds or is receiving: the newest complete one and any newer ones."""

    def __init__(self) -> None:
        self._streams: dict[int, VersionStream] = {}
        self._changed = asyncio.Condition()

    def latest_complete(self) -> VersionStream | None:
        done = [s for s in self._streams.values() if s.complete]
        return max(done, key=lambda s: s.version) if done else None

    def get(self, version: int) -> VersionStream | None:
        return self._streams.get(version)

    async def begin(self, version: int, have: int | None = None) -> tuple[VersionStream, bool]:
        """The stream of `version`, and True when the caller must fill it (no live one existed; a
        new one may be a delta from `have`)."""
        async with self._changed:
            s = self._streams.get(version)
            if s is not None and (not s.done or s.complete):
                return s, False
            s = self._streams[version] = VersionStream(version, have)
            self._changed.notify_all()
            return s, True

    async def ended(self, stream: VersionStream) -> None:
        """After a fill: drop a failed stream, or the versions older than a newly complete one."""
        async with self._changed:
            if not stream.complete:
                if self._streams.get(stream.version) is stream:
                    del self._streams[stream.version]
            else:
                for v in [v for v in self._streams if v < stream.version]:
                    del self._streams[v]
            self._changed.notify_all()

    async def stream_for(self, version: int, wait_s: float) -> VersionStream:
        """What a child's pull of `version` (0 = the newest live one) reads; waits up to `wait_s` for
        a version this relay has not begun yet. Raises `VersionNotHeld`."""

        def pick() -> VersionStream | None:
            if version:
                return self._streams.get(version)
            live = [s for s in self._streams.values() if s.error is None]
            return max(live, key=lambda s: s.version) if live else None

        async with self._changed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(
                        lambda: pick() is not None or (version and self._newer_complete(version))
                    ),
                    wait_s,
                )
            s = pick()
        if s is None:
            raise VersionNotHeld(f"version {version or 'latest'} is not held here")
        return s

    def _newer_complete(self, version: int) -> bool:
        latest = self.latest_complete()
        return latest is not None and latest.version > version


async def pull_version(
    store: RelayStore,
    version: int,
    sources: Sequence[tuple[str, Source]],
    stall_s: float,
    have: int | None = None,
) -> VersionStream:
    """Fill `store`'s stream of `version` from the first source that delivers it whole (see the
    module docstring), asking each for a delta from `have` (None: in full); returns the stream,
    complete or failed. A stream already live is awaited."""
    stream, mine = await store.begin(version, have)
    if not mine:
        await stream.wait_done()
        return stream
    errors: list[str] = []
    try:
        for name, source in sources:
            try:
                await _fill_from(stream, source(version, stream.have), stall_s)
                break
            except Exception as exc:  # noqa: BLE001 - any failure: the next source
                why = (
                    "no chunk within the stall timeout"
                    if isinstance(exc, asyncio.TimeoutError)
                    else f"{type(exc).__name__}: {exc}"
                )
                errors.append(f"{name or 'synchronizer'}: {why}")
                log.warning("relay source failed", version=version, source=name or "synchronizer", held=len(stream.chunks), error=why[:300])  # fmt: skip
    finally:  # cancelled too: readers must not wait forever
        await asyncio.shield(
            stream.finish(None if stream.check.complete else "; ".join(errors) or "no source delivered it")
        )
        await asyncio.shield(store.ended(stream))
    return stream


async def _fill_from(stream: VersionStream, chunks: AsyncIterator[bytes], stall_s: float) -> None:
    """Append what `chunks` brings past the chunks already held (those must be identical)."""
    held = len(stream.chunks)
    i = 0
    it = aiter(chunks)
    try:
        while True:
            try:
                raw = await asyncio.wait_for(anext(it), stall_s)
            except StopAsyncIteration:
                break
            if i < held:
                if raw != stream.chunks[i]:
                    raise MissingChunkError(f"version {stream.version}: chunk {i} differs from the one held")
            else:
                await stream.append(raw)
            i += 1
        if not stream.check.complete:
            c = stream.check
            raise MissingChunkError(f"stream ended after {c.count} of {c.total} chunks")
    finally:
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()
