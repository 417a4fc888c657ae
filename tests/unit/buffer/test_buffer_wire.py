"""The buffer's wire shortcuts agree with protobuf: received experience bytes are sliced exactly, and a
GetBatchResponse assembled from stored payloads parses to the same message protobuf would build."""

from __future__ import annotations

from rft.v1 import buffer_pb2

from services.buffer.records import WireBatch, encode_batch_response, group_records
from tests.support.buffer_data import batch, group


def test_wire_batch_slices_each_experience():
    msg = batch(group("a", 2), group("b", 3), vocab_size=50, producer_id="p")
    wire = WireBatch.parse(msg.SerializeToString())
    assert wire.message == msg
    assert wire.members == [e.SerializeToString() for e in msg.experiences]


def test_assembled_response_equals_protobuf():
    msg = batch(group("a", 2), group("b", 1))
    wire = WireBatch.parse(msg.SerializeToString())
    payloads = [r.payload for r in group_records(wire.message.experiences, wire.members)]
    data = encode_batch_response(payloads, "lease-1", True, 1_795_000_000_123, 7)
    expected = buffer_pb2.GetBatchResponse(
        lease_id="lease-1",
        experiences=list(msg.experiences),
        partial=True,
        lease_deadline_ms=1_795_000_000_123,
        dropped_stale=7,
    )
    assert buffer_pb2.GetBatchResponse.FromString(data) == expected
