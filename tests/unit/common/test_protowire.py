"""The one varint encoder and decoder and the one field walk (`services/common/protowire.py`) against
protobuf's own bytes."""

from __future__ import annotations

import pytest
from rft.v1 import common_pb2

from services.common.protowire import WireTypeError, encode_varint, iter_fields, read_varint


@pytest.mark.parametrize("n", [1, 127, 128, 300, 0x3FFF, 0x4000, 2**31 - 1, 2**40 + 5, 2**63 - 1])
def test_varints_match_protobuf_and_read_back(n):
    wire = common_pb2.ModelVersion(version=n).SerializeToString()  # field 1, varint
    assert wire == b"\x08" + encode_varint(n)
    assert read_varint(b"xx" + wire, 3) == (n, len(wire) + 2)
    assert read_varint(memoryview(wire), 1) == (n, len(wire))


def test_zero_is_one_byte():  # protobuf omits a zero field, so it is checked on its own
    assert encode_varint(0) == b"\x00" and read_varint(b"\x00", 0) == (0, 1)


def test_a_truncated_varint_is_an_index_error():
    with pytest.raises(IndexError):
        read_varint(encode_varint(300)[:1], 0)


def test_the_field_walk_yields_varints_and_slices_and_steps_over_fixed_fields():
    version = common_pb2.ModelVersion(version=300, checkpoint_path="p").SerializeToString()
    chunk = common_pb2.WeightChunk(version=common_pb2.ModelVersion(version=7), index=2, data=b"abc")
    wire = b"\x09" + bytes(8) + chunk.SerializeToString() + b"\x15" + bytes(4)  # fixed64 1st, fixed32 last
    found = [(f, w, v) for f, w, v, _ in iter_fields(wire)]
    assert found == [(1, 2, 2), (2, 0, 2), (4, 2, 3)]
    f, w, length, pos = next(iter_fields(version))  # field 1 (version), a varint; position after it
    assert (f, w, length, pos) == (1, 0, 300, 3)
    slices = [bytes(wire[p : p + n]) for f, w, n, p in iter_fields(wire) if w == 2]
    assert slices == [common_pb2.ModelVersion(version=7).SerializeToString(), b"abc"]
    with pytest.raises(WireTypeError, match="unsupported wire type 3") as err:
        list(iter_fields(b"\x0b"))
    assert (err.value.field, err.value.wire) == (1, 3) and isinstance(err.value, ValueError)
