"""The `memory` method's wire format: a state dict as safetensors bytes cut into `rft.v1.WeightChunk`s.

The trainer encodes once (`state_dict_to_chunks`) and streams the chunks to the synchronizer over
gRPC; the synchronizer keeps the latest version's chunks as they are (no re-encoding) and streams
them to each explorer, which rebuilds the state dict (`chunks_to_state_dict`). Chunks default to
1 MiB, well under gRPC's 4 MiB receive limit. Any language that reads safetensors can pull weights.

Copies: encoding makes the safetensors payload once and each chunk's `bytes` once (protobuf needs
`bytes`); decoding joins the chunks into one preallocated `bytearray` and views the tensors out of
it (see `codec.py`). The wire forms (`encode_raw_chunks` / `raw_chunks_to_state_dict`, used by
`SyncClient` with pass-through (de)serializers) skip the message objects: a chunk is serialized
straight from a view of the payload (its small header once, the data appended as field 4), and a
received chunk's data is copied from the wire bytes into the joined buffer without being parsed
into a message first. Every chunk carries `index`, `total`, `total_bytes` and the version, so the
receiver detects a missing, repeated, reordered or mixed-version chunk and raises
`MissingChunkError` naming it. A stream may carry a weight delta instead of the payload (`delta` set,
against `delta_base_version`; see `delta.py`): `split_chunks(..., delta_base=v)` cuts one and
`join_raw_chunks` says which of the two it joined.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from rft.v1 import common_pb2

from services.common.protowire import WireTypeError, encode_varint, iter_fields
from services.weight_sync.errors import MissingChunkError
from services.weight_sync.wire.codec import (
    decode_state_dict,
    encode_state_dict_buffer,
    encode_state_dict_segments,
)

DEFAULT_CHUNK_BYTES = 1 << 20


@dataclass
class StreamCheck:
    """The checks a receiver of a chunk stream makes chunk by chunk (the synchronizer's push, a relay's
    pull): one version and total throughout, indices 0..total-1 in order, at most `total_bytes` bytes;
    `complete` once all `total` chunks and exactly `total_bytes` bytes are in."""

    version: int = 0
    step: int = 0
    total: int = 0
    total_bytes: int = 0
    count: int = 0
    received: int = 0

    def add(self, *, version: int, step: int, index: int, total: int, total_bytes: int, nbytes: int) -> None:
        if self.count == 0:
            if total < 1 or total_bytes < 0:
                raise MissingChunkError(f"chunk 0 declares total={total}, total_bytes={total_bytes}")
            self.version, self.step, self.total, self.total_bytes = version, step, total, total_bytes
        elif (version, total, total_bytes) != (self.version, self.total, self.total_bytes):
            raise MissingChunkError(
                f"chunk {index} (version {version}, total {total}) does not belong to the stream of "
                f"version {self.version} (total {self.total})"
            )
        if index != self.count:
            what = "missing" if index > self.count else "repeated or out of order"
            raise MissingChunkError(f"version {version}: expected chunk {self.count}, got {index} ({what})")
        if self.received + nbytes > self.total_bytes:
            raise MissingChunkError(
                f"version {version}: chunk {index} overflows total_bytes {self.total_bytes}"
            )
        self.count += 1
        self.received += nbytes

    @property
    def complete(self) -> bool:
        return self.count > 0 and self.count == self.total and self.received == self.total_bytes


def _model_version(version: int | common_pb2.ModelVersion, step: int | None) -> common_pb2.ModelVersion:
    if isinstance(version, common_pb2.ModelVersion):
        return version
    return common_pb2.ModelVersion(version=version, step=version if step is None else step)


def split_chunks(
    payload: bytes,
    version: int | common_pb2.ModelVersion,
    *,
    step: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    delta_base: int | None = None,
) -> Iterator[common_pb2.WeightChunk]:
    """Cut `payload` into `WeightChunk`s of at most `chunk_bytes` (at least one chunk, even if empty);
    with `delta_base` the payload is a weight delta from that version (the chunks say so)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    mv = memoryview(payload)
    total_bytes = len(mv)
    total = max(1, -(-total_bytes // chunk_bytes))
    mver = _model_version(version, step)
    for i in range(total):
        yield common_pb2.WeightChunk(
            version=mver,
            index=i,
            total=total,
            data=bytes(mv[i * chunk_bytes : (i + 1) * chunk_bytes]),
            total_bytes=total_bytes,
            delta=delta_base is not None,
            delta_base_version=delta_base or 0,
        )


def join_chunks(chunks: Iterable[common_pb2.WeightChunk]) -> tuple[common_pb2.ModelVersion, bytearray]:
    """Check order and completeness and join the data into one `bytearray`; returns (version, payload)."""
    buf: bytearray | None = None
    first: common_pb2.WeightChunk | None = None
    pos = expected = 0
    for chunk in chunks:
        if first is None:
            first = chunk
            if chunk.total < 1 or chunk.total_bytes < 0:
                raise MissingChunkError(
                    f"chunk 0 declares total={chunk.total}, total_bytes={chunk.total_bytes}"
                )
            buf = bytearray(chunk.total_bytes)
        where = f"version {first.version.version}"
        if (
            chunk.version != first.version
            or chunk.total != first.total
            or chunk.total_bytes != first.total_bytes
        ):
            raise MissingChunkError(
                f"chunk {chunk.index} (version {chunk.version.version}, total {chunk.total}) does not belong "
                f"to the stream of {where} (total {first.total})"
            )
        if chunk.index != expected:
            what = "missing" if chunk.index > expected else "repeated or out of order"
            raise MissingChunkError(
                f"{where}: expected chunk {expected} of {first.total}, got {chunk.index} ({what})"
            )
        n = len(chunk.data)
        if pos + n > len(buf):
            raise MissingChunkError(f"{where}: chunk {chunk.index} overflows total_bytes {first.total_bytes}")
        buf[pos : pos + n] = chunk.data
        pos += n
        expected += 1
    if first is None:
        raise MissingChunkError("empty chunk stream: no chunk arrived")
    if expected != first.total:
        raise MissingChunkError(
            f"version {first.version.version}: stream ended after {expected} of {first.total} chunks "
            f"(chunk {expected} is missing)"
        )
    if pos != first.total_bytes:
        raise MissingChunkError(
            f"version {first.version.version}: got {pos} bytes, expected {first.total_bytes}"
        )
    return first.version, buf


def state_dict_to_chunks(
    state_dict: Mapping[str, torch.Tensor],
    version: int | common_pb2.ModelVersion,
    *,
    step: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> list[common_pb2.WeightChunk]:
    """Encode a state dict (any device, tied weights allowed) into the chunks of one version."""
    payload = encode_state_dict_buffer(state_dict)
    return list(split_chunks(payload, version, step=step, chunk_bytes=chunk_bytes))


def chunks_to_state_dict(
    chunks: Iterable[common_pb2.WeightChunk], device: str | torch.device = "cpu"
) -> tuple[common_pb2.ModelVersion, dict[str, torch.Tensor]]:
    """The version and the state dict carried by a complete chunk stream."""
    version, payload = join_chunks(chunks)
    state_dict, _ = decode_state_dict(payload, device)
    return version, state_dict


# ---- wire forms: serialized `WeightChunk`s without message objects ----------------------------------
_DATA_TAG = bytes([4 << 3 | 2])  # field 4 (data), length-delimited


class _WireChunk(NamedTuple):
    version: common_pb2.ModelVersion
    index: int
    total: int
    total_bytes: int
    data: memoryview
    delta: bool = False
    delta_base_version: int = 0


def encode_raw_chunks(
    state_dict: Mapping[str, torch.Tensor],
    version: int | common_pb2.ModelVersion,
    *,
    step: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> list[bytes]:
    """`state_dict_to_chunks`, serialized: each item is the wire bytes of one `WeightChunk`."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    segments = encode_state_dict_segments(state_dict)
    total_bytes = sum(len(s) for s in segments)
    total = max(1, -(-total_bytes // chunk_bytes))
    mver = _model_version(version, step)
    out = []
    seg, pos = 0, 0  # next unread byte: segments[seg][pos:]
    for i in range(total):
        want = min(chunk_bytes, total_bytes - i * chunk_bytes)
        head = common_pb2.WeightChunk(version=mver, index=i, total=total, total_bytes=total_bytes)
        parts = [head.SerializeToString(), _DATA_TAG, encode_varint(want)]
        while want:
            take = min(want, len(segments[seg]) - pos)
            parts.append(segments[seg][pos : pos + take])
            want -= take
            pos += take
            if pos == len(segments[seg]):
                seg, pos = seg + 1, 0
        out.append(b"".join(parts))  # the one copy of every tensor byte
    return out


def parse_raw_chunk(raw: bytes | memoryview) -> _WireChunk:
    """The fields of one serialized `WeightChunk`; `data` is a view into `raw` (no copy)."""
    buf = memoryview(raw)
    version = common_pb2.ModelVersion()
    data = buf[0:0]
    varints = {2: 0, 3: 0, 5: 0, 6: 0, 7: 0}  # index, total, total_bytes, delta, delta_base_version
    try:
        for field, wire, value, pos in iter_fields(buf):
            if wire == 0:
                if field in varints:
                    varints[field] = value
            elif pos + value > len(buf):
                raise MissingChunkError("truncated WeightChunk (a field runs past the end)")
            elif field == 4:
                data = buf[pos : pos + value]
            elif field == 1:
                version = common_pb2.ModelVersion.FromString(bytes(buf[pos : pos + value]))
    except IndexError:
        raise MissingChunkError("truncated WeightChunk (varint runs past the end)") from None
    except WireTypeError as exc:
        raise MissingChunkError(
            f"WeightChunk field {exc.field} has unsupported wire type {exc.wire}"
        ) from None
    index, total, total_bytes, delta, delta_base = (varints[f] for f in (2, 3, 5, 6, 7))
    return _WireChunk(
        version,
        _signed32(index),
        _signed32(total),
        _signed64(total_bytes),
        data,
        bool(delta),
        _signed64(delta_base),
    )


def _signed32(v: int) -> int:
    v &= (1 << 32) - 1
    return v - (1 << 32) if v >= 1 << 31 else v


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def raw_chunks_to_state_dict(
    raws: Iterable[bytes], device: str | torch.device = "cpu"
) -> tuple[common_pb2.ModelVersion, dict[str, torch.Tensor]]:
    """`chunks_to_state_dict` for serialized chunks: same checks, data copied once into the payload."""
    version, payload = join_chunks(parse_raw_chunk(r) for r in raws)  # type: ignore[arg-type]
    state_dict, _ = decode_state_dict(payload, device)
    return version, state_dict


def join_raw_chunks(raws: Iterable[bytes]) -> tuple[common_pb2.ModelVersion, int | None, bytearray]:
    """`join_chunks` for serialized chunks: (version, the delta's base version or None for a full
    payload, the joined data). Every chunk must agree on being a delta and on its base."""
    parsed = [parse_raw_chunk(r) for r in raws]
    kinds = {(c.delta, c.delta_base_version) for c in parsed}
    if len(kinds) > 1:
        raise MissingChunkError(f"chunks of one stream disagree on being a delta: {sorted(kinds)}")
    version, payload = join_chunks(parsed)  # type: ignore[arg-type]
    return version, (parsed[0].delta_base_version if parsed[0].delta else None), payload
