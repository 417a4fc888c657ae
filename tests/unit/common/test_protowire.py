"""The one varint encoder and decoder (`services/common/protowire.py`) against protobuf's own bytes."""

from __future__ import annotations

import pytest
from rft.v1 import common_pb2

from services.common.protowire import encode_varint, read_varint


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
