"""Protobuf's base-128 varints, written and read without message objects: one encoder, one decoder and
one walk over a message's top-level fields (`iter_fields`) for every hand-parsed wire form (the
buffer's experience frames, the weight chunks' wire form)."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["WireTypeError", "encode_varint", "iter_fields", "read_varint"]


def encode_varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint."""
    if value < 0x4000:  # lengths of a usual size: one or two bytes
        return bytes((value,)) if value < 0x80 else bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes | bytearray | memoryview, i: int) -> tuple[int, int]:
    """The protobuf varint at `data[i]` and the index after it; `IndexError` when it runs past the end."""
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


class WireTypeError(ValueError):
    """A field of a wire type the hand parsers do not read (the deprecated groups, 3 and 4)."""

    def __init__(self, field: int, wire: int):
        super().__init__(f"unsupported wire type {wire}")
        self.field, self.wire = field, wire


def iter_fields(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, int, int, int]]:
    """Each top-level field of the message in `data` as (field number, wire type, value, position): a
    varint's value (position: after it); a length-delimited field's length (position: its first byte,
    the walk goes on after it). Fixed 32- and 64-bit fields are stepped over, not yielded.
    `IndexError`: a varint runs past the end; `WireTypeError`: a group."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
            yield field, wire, value, pos
        elif wire == 2:
            length, pos = read_varint(data, pos)
            yield field, wire, length, pos
            pos += length
        elif wire == 5:
            pos += 4
        elif wire == 1:
            pos += 8
        else:
            raise WireTypeError(field, wire)
