"""TensorSpec <-> rft.v1.TensorMeta, GroupInfo <-> WeightSyncGroupInfo, and the bucket plan."""

from __future__ import annotations

import pytest
import torch
from rft.v1 import common_pb2

from services.weight_sync import GroupInfo, TensorSpec, specs_from_proto, specs_of, specs_to_proto
from services.weight_sync.wire.buckets import ALIGN, pack, plan_buckets, unpack
from services.weight_sync.wire.specs import fingerprint


def _sd() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(3, 5, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "big": torch.randn(40, 40, generator=g),
        "mask": torch.tensor([True, False, True]),
        "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
    }


def test_specs_round_trip_through_proto():
    specs = specs_of(_sd())
    assert [s.name for s in specs] == list(_sd())
    assert specs[1] == TensorSpec("b", torch.bfloat16, (7,))
    metas = specs_to_proto(specs)
    assert metas[1].dtype == common_pb2.DTYPE_BFLOAT16 and list(metas[0].shape) == [3, 5]
    wire = [common_pb2.TensorMeta.FromString(m.SerializeToString()) for m in metas]
    assert specs_from_proto(wire) == specs
    assert specs[0].nbytes == 60 and specs[2].shape == () and specs[3].numel == 0


def test_bad_dtypes_and_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="complex64"):
        TensorSpec("c", torch.complex64, (2,))
    with pytest.raises(ValueError, match="not a supported"):
        TensorSpec.from_proto(common_pb2.TensorMeta(name="x", dtype=common_pb2.DTYPE_UNSPECIFIED))
    with pytest.raises(ValueError, match="twice"):
        specs_of([("a", torch.zeros(1)), ("a", torch.zeros(1))])


def test_fingerprint_changes_with_any_field():
    specs = specs_of(_sd())
    changed = [*specs[:1], TensorSpec("b", torch.float16, (7,)), *specs[2:]]
    assert fingerprint(specs) == fingerprint(specs_of(_sd()))
    assert fingerprint(specs) != fingerprint(changed)
    assert 0 <= fingerprint(specs) < 2**63


def test_group_info_round_trips_through_proto():
    info = GroupInfo(
        "10.0.0.1", 29500, 5, specs=specs_of(_sd()), generation=3, timeout_s=60, bucket_bytes=1 << 20
    )
    back = GroupInfo.from_proto(
        common_pb2.WeightSyncGroupInfo.FromString(info.to_proto().SerializeToString())
    )
    assert back == info
    # fields left unset (proto3's zero) take the defaults
    assert GroupInfo.from_proto(
        common_pb2.WeightSyncGroupInfo(master_address="h", master_port=1, world_size=2)
    ) == (GroupInfo("h", 1, 2))
    with pytest.raises(ValueError, match="world_size"):
        GroupInfo("h", 1, 1)


def test_bucket_plan_keeps_order_and_limits_and_sends_big_tensors_alone():
    specs = specs_of(_sd())
    plan = plan_buckets(specs, 256)
    assert [s.spec.name for b in plan for s in b.slots] == [s.name for s in specs]
    for b in plan:
        assert b.solo == (b.slots[0].spec.name == "big")
        if not b.solo:
            assert b.nbytes <= 256
            assert all(s.offset % ALIGN == 0 for s in b.slots)
    assert sum(b.solo for b in plan) == 1
    with pytest.raises(ValueError):
        plan_buckets(specs, 0)


@pytest.mark.parametrize("bucket_bytes", [64, 256, 1 << 20])
def test_pack_unpack_is_bit_exact_for_mixed_dtypes(bucket_bytes):
    sd = _sd()
    plan = plan_buckets(specs_of(sd), bucket_bytes)
    buf = torch.empty(bucket_bytes, dtype=torch.uint8)
    got = {}
    for bucket in plan:
        flat = pack(bucket, [sd[s.spec.name] for s in bucket.slots], buf).clone()  # "the wire"
        got.update(unpack(bucket, flat))
    assert list(got) == list(sd)
    for name, t in sd.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        assert torch.equal(got[name].view(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))


def test_pack_accepts_non_contiguous_tensors():
    t = torch.arange(12.0).reshape(3, 4).t()
    (bucket,) = plan_buckets(specs_of({"t": t}), 1024)
    ((_, out),) = unpack(bucket, pack(bucket, [t], torch.empty(1024, dtype=torch.uint8)).clone())
    assert torch.equal(out, t)
