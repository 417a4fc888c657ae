"""Weight deltas (`weight_sync/wire/delta.py`): bit-exact round trips, full payload when the tensors
differ, loud failures naming the tensor, and a small delta for a realistic change."""

from __future__ import annotations

import struct

import pytest
import torch

from services.weight_sync import DeltaMismatchError, WeightSyncError
from services.weight_sync.wire.chunks import join_raw_chunks, split_chunks
from services.weight_sync.wire.codec import decode_state_dict, encode_state_dict_buffer
from services.weight_sync.wire.delta import apply_delta, make_delta, read_delta_header


def _sd(dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(64, 32, generator=g).to(dtype)
    return {
        "embed": emb,
        "head": emb,  # tied: stored once
        "w": torch.randn(128, 96, generator=g).to(dtype),
        "norm": torch.randn(32, generator=g).to(dtype),
        "step": torch.tensor([7], dtype=torch.int64),
        "empty": torch.zeros(0, 3, dtype=dtype),
    }


def _nudged(sd: dict[str, torch.Tensor], frac: float, seed: int = 1) -> dict[str, torch.Tensor]:
    """`sd` with about `frac` of the float words moved by one ulp (ties kept)."""
    g = torch.Generator().manual_seed(seed)
    out, done = {}, {}
    for name, t in sd.items():
        key = t.data_ptr()
        if key in done and t.numel():
            out[name] = done[key]
            continue
        new = t.clone()
        if t.is_floating_point() and t.numel():
            mask = torch.rand(t.shape, generator=g) < frac
            words = new.view(torch.int16 if t.element_size() == 2 else torch.int32)
            words[mask] += 1
        out[name] = done[key] = new
    return out


def _payload(sd: dict[str, torch.Tensor]) -> bytes:
    return bytes(encode_state_dict_buffer(sd))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_round_trip_is_bit_exact(dtype):
    base_sd = _sd(dtype)
    base, new = _payload(base_sd), _payload(_nudged(base_sd, 0.05))
    delta = make_delta(base, new, 3, 4)
    assert delta is not None
    head = read_delta_header(delta)
    assert (head.base_version, head.target_version, head.payload_bytes) == (3, 4, len(new))
    assert {t.name for t in head.tensors} == {"embed", "w", "norm", "step", "empty"}
    got = apply_delta(base, delta, base_version=3)
    assert bytes(got) == new
    state, _ = decode_state_dict(got)
    assert state["head"].data_ptr() == state["embed"].data_ptr()  # the tie survives


def test_unchanged_tensors_carry_no_frame_and_same_payload_gives_tiny_delta():
    base = _payload(_sd(torch.bfloat16))
    delta = make_delta(base, base, 1, 1)
    assert delta is not None and all(t.compressed == 0 for t in read_delta_header(delta).tensors)
    assert len(delta) < 2048 and bytes(apply_delta(base, delta)) == base


def test_different_tensors_or_metadata_give_no_delta():
    sd = _sd(torch.float32)
    base = _payload(sd)
    renamed = _payload({("w2" if k == "w" else k): v for k, v in sd.items()})
    reshaped = _payload({**sd, "w": sd["w"].reshape(96, 128)})
    recast = _payload({**sd, "norm": sd["norm"].to(torch.bfloat16)})
    assert make_delta(base, renamed, 1, 2) is None
    assert make_delta(base, reshaped, 1, 2) is None
    assert make_delta(base, recast, 1, 2) is None
    assert make_delta(base, b"not safetensors", 1, 2) is None


def test_corrupted_delta_or_wrong_base_raises_naming_the_tensor():
    sd = _sd(torch.bfloat16)
    base, new = _payload(sd), _payload(_nudged(sd, 0.05))
    delta = make_delta(base, new, 1, 2)
    w = next(t for t in read_delta_header(delta).tensors if t.name == "w")

    wrong_base = bytearray(base)
    wrong_base[w.offset + 10] ^= 0x01  # the receiver's copy of "w" differs from the sender's
    with pytest.raises(DeltaMismatchError, match="'w'.*checksum"):
        apply_delta(wrong_base, delta)

    head = read_delta_header(delta)
    start = head.frames_start + sum(t.compressed for t in head.tensors[: head.tensors.index(w)])
    bad = bytearray(delta)
    bad[start + w.compressed // 2] ^= 0xFF  # a flipped byte inside w's zstd frame
    with pytest.raises(DeltaMismatchError, match="'w'"):
        apply_delta(base, bytes(bad))

    with pytest.raises(DeltaMismatchError, match="against version 1"):
        apply_delta(base, delta, base_version=5)
    with pytest.raises(DeltaMismatchError, match="truncated"):
        apply_delta(base, delta[:-3])
    with pytest.raises(DeltaMismatchError, match="magic"):
        apply_delta(base, b"garbage" * 4)
    with pytest.raises(DeltaMismatchError, match="payload"):
        apply_delta(base[:-2], delta)
    assert issubclass(DeltaMismatchError, WeightSyncError)


def test_one_percent_change_compresses_well_below_the_full_size():
    g = torch.Generator().manual_seed(0)
    sd = {f"layer{i}": torch.randn(256, 256, generator=g).to(torch.bfloat16) for i in range(8)}
    base, new = _payload(sd), _payload(_nudged(sd, 0.01))
    delta = make_delta(base, new, 1, 2)
    assert delta is not None and len(delta) < 0.1 * len(new), (len(delta), len(new))
    assert bytes(apply_delta(base, delta)) == new


def test_delta_chunks_say_what_they_carry():
    sd = _sd(torch.float32)
    base, new = _payload(sd), _payload(_nudged(sd, 0.1))
    delta = make_delta(base, new, 1, 2)
    raws = [c.SerializeToString() for c in split_chunks(delta, 2, chunk_bytes=512, delta_base=1)]
    assert len(raws) > 1
    version, base_version, data = join_raw_chunks(raws)
    assert (version.version, base_version, bytes(data)) == (2, 1, delta)
    full = [c.SerializeToString() for c in split_chunks(new, 2, chunk_bytes=512)]
    assert join_raw_chunks(full)[1] is None
    with pytest.raises(WeightSyncError, match="disagree"):
        join_raw_chunks([raws[0], *full[1:]])
    assert struct.unpack("<Q", delta[8:16])[0] > 0
