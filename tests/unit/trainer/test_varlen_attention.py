"""The trainer's varlen attention equals transformers' packed sdpa attention (forward and gradients)."""

from __future__ import annotations

import pytest
import torch

from services.common.modeling import load_model
from services.common.tiny_model import make_tiny_model
from services.trainer import varlen_attention
from services.trainer.collate import ModelShape

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def packed_row(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (1, sum(lengths)), generator=g)
    return ids, torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)


@pytest.mark.parametrize("lengths", [[5, 7, 6, 40, 3, 1], [12], [9] * 20 + [70, 33]])
def test_varlen_equals_packed_sdpa(model_dir, lengths):
    reference, varlen = load_model(model_dir), load_model(model_dir)
    assert varlen_attention.enable(varlen) and ModelShape.of(varlen).varlen_attention
    ids, pos = packed_row(lengths)
    out = {}
    for name, model in (("ref", reference), ("varlen", varlen)):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        logits.log_softmax(-1)[..., :7].sum().backward()
        out[name] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(out["varlen"][0], out["ref"][0], atol=2e-5, rtol=0)
    for n, g in out["ref"][1].items():
        torch.testing.assert_close(out["varlen"][1][n], g, atol=1e-4, rtol=1e-3)


def test_sequences_are_bucketed_by_length():
    _, pos = packed_row([5, 7, 40, 3, 9])
    buckets = varlen_attention.segments(pos)
    assert sorted((b.count, b.longest) for b in buckets) == [(1, 9), (1, 40), (3, 7)]
    covered = torch.sort(torch.cat([b.tokens for b in buckets])).values
    assert torch.equal(covered, torch.arange(pos.numel()))  # every token in exactly one bucket


def test_varlen_attention_refuses_a_batch_without_position_ids(model_dir):
    model = load_model(model_dir)
    varlen_attention.enable(model)
    with pytest.raises(ValueError, match="position_ids"):
        model(input_ids=torch.randint(3, 500, (2, 6)), attention_mask=torch.ones(2, 6, dtype=torch.long))
