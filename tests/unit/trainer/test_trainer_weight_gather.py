"""`weight_gather` on one process: kinds, the wire dtype, private copies, one cast at a time.

The 2-rank FSDP2 gather and the CUDA one are in tests/integration/trainer/test_weight_gather_ranks.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from services.trainer.weight_gather import (
    ADAPTER,
    FULL,
    FULL_ON_DEVICE,
    cast_state,
    compute_dtype,
    gather_full,
    iter_full_tensors,
    parse_kind,
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 6), nn.Linear(6, 11, bias=False))
    model[1].weight = model[0].weight  # tied
    model.register_buffer("count", torch.arange(3))
    return model


def test_kinds():
    assert parse_kind(None) == parse_kind(FULL) == (FULL, False)
    assert parse_kind(FULL_ON_DEVICE) == (FULL, True)
    assert parse_kind(ADAPTER) == (ADAPTER, False)
    with pytest.raises(ValueError, match="not one of"):
        parse_kind("ful")


def test_a_plain_module_gathers_private_copies_in_its_own_dtype():
    model = _model()
    assert compute_dtype(model) is None  # no FSDP2 policy: fp32 stays fp32 (bit-identical CPU runs)
    got = gather_full(model)
    sd = model.state_dict()
    assert list(got) == list(sd)
    storages = {t.untyped_storage().data_ptr() for t in got.values()}
    assert len(storages) == len(got)  # tied names get their own tensor, none is a parameter's
    for name, t in sd.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
        assert got[name].untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_a_requested_dtype_casts_floating_tensors_only():
    model = _model()
    got = dict(iter_full_tensors(model, dtype=torch.bfloat16, device="cpu"))
    assert got["0.weight"].dtype == torch.bfloat16 and got["count"].dtype == torch.int64
    assert torch.equal(got["0.weight"], model[0].weight.detach().to(torch.bfloat16))
    assert sum(t.untyped_storage().nbytes() for t in got.values()) == sum(
        t.numel() * (2 if t.is_floating_point() else t.element_size()) for t in model.state_dict().values()
    )


def test_cast_state_replaces_tensors_in_place():
    state = {"w": torch.ones(3), "n": torch.arange(2)}
    out = cast_state(state, torch.bfloat16)
    assert out is state and state["w"].dtype == torch.bfloat16 and state["n"].dtype == torch.int64
    assert cast_state(state, None) is state


def test_a_snapshot_stays_on_the_device_only_for_an_nccl_group():
    from services.trainer.weight_sync import broadcasts_on_device

    assert broadcasts_on_device("auto", "cuda:0")  # NCCL: broadcast straight from GPU memory
    assert broadcasts_on_device("nccl", "cuda:1")
    assert not broadcasts_on_device("gloo", "cuda:0")  # one GPU shared: host copy, through /dev/shm
    assert not broadcasts_on_device("auto", "cpu")
    assert not broadcasts_on_device("nccl", "cpu")  # refused when the group is joined, not here
