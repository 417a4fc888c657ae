"""The memory method's store: the latest published version as the chunk bytes the trainer pushed.

A push is validated as it streams (`PushAssembly`: one version, indices 0..total-1 in order, the
byte count equal to `total_bytes`) and becomes visible only on `finish()`: a stream that breaks,
is cancelled or is inconsistent leaves the store and `model_version` as they were. Chunks are kept
as received - serialized `rft.v1.WeightChunk` messages - so each pull streams the same bytes with no
decoding or re-encoding; only the latest version is kept (a pull in flight holds its own reference).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.weight_sync import MissingChunkError


@dataclass(frozen=True)
class StoredWeights:
    version: int
    step: int
    chunks: tuple[bytes, ...]  # serialized rft.v1.WeightChunk messages, in order
    total_bytes: int


class PushAssembly:
    """Collects one pushed stream; `add` checks each chunk's header, `finish` checks completeness."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.step = 0
        self.total = 0
        self.total_bytes = 0
        self._received = 0
        self._chunks: list[bytes] = []

    def add(
        self, *, version: int, step: int, index: int, total: int, total_bytes: int, nbytes: int, raw: bytes
    ) -> None:
        if self.version is None:
            if total < 1 or total_bytes < 0:
                raise MissingChunkError(f"chunk 0 declares total={total}, total_bytes={total_bytes}")
            self.version, self.step, self.total, self.total_bytes = version, step, total, total_bytes
        elif (version, total, total_bytes) != (self.version, self.total, self.total_bytes):
            raise MissingChunkError(
                f"chunk {index} (version {version}, total {total}) does not belong to the stream of "
                f"version {self.version} (total {self.total})"
            )
        if index != len(self._chunks):
            what = "missing" if index > len(self._chunks) else "repeated or out of order"
            raise MissingChunkError(
                f"version {version}: expected chunk {len(self._chunks)}, got {index} ({what})"
            )
        self._received += nbytes
        if self._received > self.total_bytes:
            raise MissingChunkError(
                f"version {version}: chunk {index} overflows total_bytes {self.total_bytes}"
            )
        self._chunks.append(raw)

    def finish(self) -> StoredWeights:
        if self.version is None:
            raise MissingChunkError("empty push: no chunk arrived")
        if len(self._chunks) != self.total or self._received != self.total_bytes:
            raise MissingChunkError(
                f"version {self.version}: stream ended after {len(self._chunks)} of {self.total} chunks "
                f"({self._received} of {self.total_bytes} bytes)"
            )
        return StoredWeights(self.version, self.step, tuple(self._chunks), self.total_bytes)
