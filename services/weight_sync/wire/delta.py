"""Weight deltas for the `memory` methods: only what changed between two payloads goes on the wire.

A training step moves most weights by less than one bf16 ulp, so most words of the next version's
safetensors payload equal the last one's. `make_delta(base, new)` XORs each tensor's raw words (in
its wire dtype: 2-byte words for bf16/fp16, 4 for fp32), splits the XOR into byte planes (all first
bytes of the words, then all second bytes, ...: unchanged words and unchanged high bytes become long
runs of zeros) and compresses each tensor's planes with zstd; `apply_delta(base, delta)` reverses it
into a copy of the base and checks every tensor against the crc32 of its new bytes. Both payloads
must have the same safetensors header (same names, dtypes, shapes, offsets, metadata); otherwise
there is no delta (`make_delta` returns None) and the sender sends the full payload.

Format (version 1), self-describing so any language with zstd and crc32 can apply it:

    bytes 0..7    magic b"RFTDLT1\\0"
    bytes 8..15   H, the header length (uint64 little-endian)
    next H bytes  JSON header (UTF-8):
                    base_version, target_version  the versions the delta goes from and to
                    payload_bytes   length of both payloads (header included)
                    prefix_crc32    crc32 of the safetensors prefix (8-byte length + JSON header)
                    tensors: list of {name, offset, length, word, changed, crc32, compressed}
                      offset, length  the tensor's bytes in the payload (absolute offsets)
                      word            XOR word size in bytes (= the dtype's item size; planes per word)
                      changed         how many words differ (informational)
                      crc32           crc32 of the tensor's bytes in the NEW payload
                      compressed      length of its zstd frame (0 = unchanged, no frame)
    then          the zstd frames, concatenated in header order; a frame decompresses to `length`
                  bytes: plane 0 (byte 0 of every word), plane 1, ... (little-endian words)

To apply: copy the base, check its length and prefix crc32, for each tensor with a frame
decompress it, regroup the planes into words and XOR them into the copy, then check each tensor's
crc32 (the unchanged ones too). Any mismatch raises `DeltaMismatchError` naming the tensor; a
receiver then pulls the full payload.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import NamedTuple

import numpy as np
import zstandard

from services.weight_sync.errors import DeltaMismatchError
from services.weight_sync.wire.codec import CodecError, read_header

__all__ = ["DeltaHeader", "DeltaTensor", "apply_delta", "make_delta", "read_delta_header"]

MAGIC = b"RFTDLT1\0"
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
Buffer = bytes | bytearray | memoryview


class DeltaTensor(NamedTuple):
    name: str
    offset: int  # absolute byte offset in the payload
    length: int  # bytes
    word: int  # XOR word size in bytes
    changed: int  # words that differ
    crc32: int  # of the new bytes
    compressed: int  # zstd frame bytes; 0 = unchanged


class DeltaHeader(NamedTuple):
    base_version: int
    target_version: int
    payload_bytes: int
    prefix_crc32: int
    tensors: tuple[DeltaTensor, ...]
    frames_start: int  # where the first frame starts in the delta

    def changed_fraction(self) -> float:
        """The fraction of the payload's tensor words that differ between the two versions."""
        words = sum(t.length // t.word for t in self.tensors)
        return sum(t.changed for t in self.tensors) / words if words else 0.0


def _layout(payload: Buffer) -> tuple[int, list[tuple[str, int, int, int]]] | None:
    """(data start, [(name, offset, length, word)]) when the tensors tile the data region exactly."""
    try:
        header, start = read_header(payload)
    except CodecError:
        return None
    header.pop("__metadata__", None)
    out = []
    for name, info in header.items():
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            word = _ITEMSIZE[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            return None
        out.append((name, start + begin, end - begin, word))
    out.sort(key=lambda t: t[1])
    pos = start
    for _, offset, length, word in out:
        if offset != pos or length % word:
            return None  # gaps or overlaps: not a layout we can diff tensor by tensor
        pos += length
    if pos != len(payload):
        return None
    return start, out


def _words(buf: Buffer, offset: int, length: int, word: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=_WORDS[word], count=length // word, offset=offset)


def make_delta(
    base: Buffer, new: Buffer, base_version: int, target_version: int, *, level: int = 1
) -> bytes | None:
    """The delta that turns `base` into `new`, or None when their headers differ (send `new` in full)."""
    base, new = memoryview(base).cast("B"), memoryview(new).cast("B")
    layout = _layout(new)
    if layout is None or len(base) != len(new):
        return None
    start, tensors = layout
    if base[:start] != new[:start]:
        return None
    cctx = zstandard.ZstdCompressor(level=level)
    entries, frames = [], []
    for name, offset, length, word in tensors:
        frame, changed = b"", 0
        if length:
            x = np.bitwise_xor(_words(base, offset, length, word), _words(new, offset, length, word))
            changed = int(np.count_nonzero(x))
            if changed:
                planes = x.view(np.uint8).reshape(-1, word).T if word > 1 else x
                frame = cctx.compress(np.ascontiguousarray(planes))
        crc = zlib.crc32(new[offset : offset + length])
        entries.append(
            {
                "name": name,
                "offset": offset,
                "length": length,
                "word": word,
                "changed": changed,
                "crc32": crc,
                "compressed": len(frame),
            }
        )
        frames.append(frame)
    head = json.dumps(
        {
            "base_version": int(base_version),
            "target_version": int(target_version),
            "payload_bytes": len(new),
            "prefix_crc32": zlib.crc32(new[:start]),
            "tensors": entries,
        },
        separators=(",", ":"),
    ).encode()
    return b"".join([MAGIC, struct.pack("<Q", len(head)), head, *frames])


def read_delta_header(delta: Buffer) -> DeltaHeader:
    """The parsed header of a delta; raises `DeltaMismatchError` when it is malformed."""
    view = memoryview(delta).cast("B")
    if len(view) < 16 or bytes(view[:8]) != MAGIC:
        raise DeltaMismatchError("not a weight delta (bad magic)")
    (n,) = struct.unpack("<Q", view[8:16])
    if 16 + n > len(view):
        raise DeltaMismatchError(f"weight delta header claims {n} bytes, {len(view) - 16} follow")
    try:
        h = json.loads(bytes(view[16 : 16 + n]))
        tensors = tuple(
            DeltaTensor(
                str(t["name"]),
                *(int(t[k]) for k in ("offset", "length", "word", "changed", "crc32", "compressed")),
            )
            for t in h["tensors"]
        )
        head = DeltaHeader(
            int(h["base_version"]), int(h["target_version"]), int(h["payload_bytes"]),
            int(h["prefix_crc32"]), tensors, 16 + n,
        )  # fmt: skip
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise DeltaMismatchError(f"weight delta header is malformed: {exc}") from exc
    if head.frames_start + sum(t.compressed for t in tensors) != len(view):
        raise DeltaMismatchError("weight delta frames do not add up to its length (truncated?)")
    return head


def apply_delta(base: Buffer, delta: Buffer, *, base_version: int | None = None) -> bytearray:
    """The new payload: `delta` applied to a copy of `base`, every tensor checked against its crc32."""
    head = read_delta_header(delta)
    if base_version is not None and head.base_version != base_version:
        raise DeltaMismatchError(
            f"delta is against version {head.base_version}, the base is version {base_version}"
        )
    if len(base) != head.payload_bytes:
        raise DeltaMismatchError(
            f"delta is for a {head.payload_bytes}-byte payload, the base has {len(base)}"
        )
    out = bytearray(base)
    prefix_end = min((t.offset for t in head.tensors), default=len(out))
    if zlib.crc32(memoryview(out)[:prefix_end]) != head.prefix_crc32:
        raise DeltaMismatchError("the base's safetensors header is not the delta's (different tensors)")
    dctx = zstandard.ZstdDecompressor()
    view, pos = memoryview(delta).cast("B"), head.frames_start
    for t in head.tensors:
        if t.word not in _WORDS or t.length % t.word or t.offset < 0 or t.offset + t.length > len(out):
            raise DeltaMismatchError(f"tensor {t.name!r}: bad delta entry {t}")
        if t.compressed:
            try:
                raw = dctx.decompress(view[pos : pos + t.compressed], max_output_size=t.length)
            except zstandard.ZstdError as exc:
                raise DeltaMismatchError(
                    f"tensor {t.name!r}: delta frame does not decompress: {exc}"
                ) from exc
            if len(raw) != t.length:
                raise DeltaMismatchError(
                    f"tensor {t.name!r}: delta frame has {len(raw)} bytes, not {t.length}"
                )
            planes = np.frombuffer(raw, dtype=np.uint8).reshape(t.word, -1)
            # the planes shifted back into words (plane k is byte k, little-endian), XORed into the
            # words in place: contiguous ufuncs, ~3x faster than XORing each plane into a strided view
            xor = planes[t.word - 1].astype(_WORDS[t.word])
            for k in range(t.word - 2, -1, -1):
                xor <<= 8
                xor |= planes[k]
            words = _words(out, t.offset, t.length, t.word)
            np.bitwise_xor(words, xor, out=words)
            pos += t.compressed
        if zlib.crc32(memoryview(out)[t.offset : t.offset + t.length]) != t.crc32:
            raise DeltaMismatchError(
                f"tensor {t.name!r}: checksum mismatch after applying the delta "
                f"(version {head.base_version} -> {head.target_version}); the base is not the sender's"
            )
    return out
