"""The memory method's chunk format: bit-exact round trips, tied weights, and loud failures."""

from __future__ import annotations

import pytest
import torch
from rft.v1 import common_pb2

from services.weight_sync import MissingChunkError, chunks_to_state_dict, state_dict_to_chunks
from services.weight_sync.wire.codec import CodecError, decode_state_dict, encode_state_dict


def _sd() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(50, 16, generator=g)
    return {
        "embed": emb,
        "head": emb,  # tied: same storage under two names
        "w": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "norm": torch.randn(16, generator=g, dtype=torch.float64),
        "scalar": torch.tensor(3),
        "empty": torch.zeros(0, 3, dtype=torch.float16),
    }


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_round_trip_is_bit_exact_and_keeps_ties():
    sd = _sd()
    chunks = state_dict_to_chunks(sd, 7, step=70, chunk_bytes=1000)
    assert len(chunks) > 3 and all(len(c.data) <= 1000 for c in chunks)
    assert {(c.total, c.version.version, c.version.step) for c in chunks} == {(len(chunks), 7, 70)}
    assert sum(len(c.data) for c in chunks) == chunks[0].total_bytes
    wire = [common_pb2.WeightChunk.FromString(c.SerializeToString()) for c in chunks]
    version, got = chunks_to_state_dict(wire)
    assert version.version == 7 and set(got) == set(sd)
    for name, t in sd.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and _bits(got[name]) == _bits(t)
    assert got["head"] is got["embed"]
    got["w"].add_(1)  # decoded tensors are writable views of the joined payload


def test_one_chunk_when_payload_is_small():
    chunks = state_dict_to_chunks({"x": torch.ones(2)}, 1)
    assert len(chunks) == 1 and chunks[0].index == 0 and chunks[0].total == 1


def test_missing_chunk_is_named():
    chunks = state_dict_to_chunks(_sd(), 3, chunk_bytes=500)
    with pytest.raises(MissingChunkError, match="expected chunk 2 of .* got 3"):
        chunks_to_state_dict(chunks[:2] + chunks[3:])
    with pytest.raises(MissingChunkError, match=f"after {len(chunks) - 1} of {len(chunks)}"):
        chunks_to_state_dict(chunks[:-1])
    with pytest.raises(MissingChunkError, match="no chunk"):
        chunks_to_state_dict([])


def test_reordered_repeated_or_mixed_version_chunks_are_refused():
    chunks = state_dict_to_chunks(_sd(), 3, chunk_bytes=500)
    other = state_dict_to_chunks(_sd(), 4, chunk_bytes=500)
    with pytest.raises(MissingChunkError, match="out of order"):
        chunks_to_state_dict([chunks[0], chunks[1], chunks[1], *chunks[2:]])
    with pytest.raises(MissingChunkError, match="does not belong"):
        chunks_to_state_dict([chunks[0], other[1], *chunks[2:]])


def test_corrupt_payload_raises_codec_error():
    payload = bytearray(encode_state_dict({"x": torch.ones(4)}))
    with pytest.raises(CodecError):
        decode_state_dict(payload[:20])
    with pytest.raises(CodecError):
        decode_state_dict(bytearray(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}"))


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1000, 1 << 20])
def test_raw_chunks_are_the_proto_chunks_and_round_trip(chunk_bytes):
    from services.weight_sync.wire.chunks import encode_raw_chunks, raw_chunks_to_state_dict
    from services.weight_sync.wire.codec import encode_state_dict_buffer, encode_state_dict_segments

    sd = _sd()
    segments = encode_state_dict_segments(sd)
    assert b"".join(segments) == bytes(encode_state_dict_buffer(sd))
    raws = encode_raw_chunks(sd, 3, step=30, chunk_bytes=chunk_bytes)
    protos = state_dict_to_chunks(sd, 3, step=30, chunk_bytes=chunk_bytes)
    assert [common_pb2.WeightChunk.FromString(r) for r in raws] == protos  # same fields, any order
    version, got = raw_chunks_to_state_dict(raws)
    assert (version.version, version.step) == (3, 30)
    for name, t in sd.items():
        assert got[name].dtype == t.dtype and _bits(got[name]) == _bits(t)
