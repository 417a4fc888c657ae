"""Protobuf's base-128 varints, written and read without message objects: one encoder and one decoder
for every hand-parsed wire form (the buffer's experience frames, the weight chunks' wire form)."""

from __future__ import annotations

__all__ = ["encode_varint", "read_varint"]


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
