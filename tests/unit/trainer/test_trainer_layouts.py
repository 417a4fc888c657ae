"""Packed and padded model inputs give the same log-probs; the cheaper layout is chosen."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.modeling import load_model
from services.trainer.actor import policy_forward
from services.trainer.collate import ModelShape, collate, layout_flops, model_inputs, pack, pad
from tests.support.trainer_data import make_experiences

torch.set_num_threads(1)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(make_tiny_model(tmp_path_factory.mktemp("tiny")), device="cpu").eval()


def test_padded_and_packed_forward_agree(model):
    step = collate(make_experiences(12, seed=3, max_response=20))
    with torch.no_grad():
        lp_packed, ent_packed = policy_forward(model, step, 0.7, CPU, entropy=True)
        shape = ModelShape.of(model)
        lp_padded, ent_padded = policy_forward(
            model, step, 0.7, CPU, entropy=True, shape=dataclasses.replace(shape, pair_flops=1e12)
        )
    assert model_inputs(step, dataclasses.replace(shape, pair_flops=1e12)).attention_mask is not None
    torch.testing.assert_close(lp_padded, lp_packed, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_padded, ent_packed, atol=1e-5, rtol=0)
    mask = step.batch.response_mask.bool()
    assert (lp_packed[mask] < 0).all() and (lp_packed[~mask] == 0).all()


def test_pad_indexes_the_positions_that_predict_response_tokens():
    step = collate(make_experiences(3, group_size=1, seed=1))
    padded, packed = pad(step, pad_token_id=0), pack(step)
    assert padded.input_ids.shape == (3, max(step.seq_lengths))
    assert torch.equal(padded.labels, packed.labels) and torch.equal(padded.rows, packed.rows)
    for k in range(len(padded.labels)):
        row, pos = int(padded.logit_rows[k]), int(padded.logit_positions[k])
        assert padded.input_ids[row, pos + 1] == padded.labels[k]  # position pos predicts the next token
        assert padded.attention_mask[row, pos + 1] == 1


def test_many_short_rows_pad_and_few_uneven_rows_pack(model):
    shape = ModelShape.of(model)
    assert not shape.varlen_attention  # sdpa on CPU: the packed mask is T x T
    short = collate(make_experiences(64, seed=2, max_response=4))
    uneven = collate(make_experiences(4, group_size=1, seed=2, max_response=3) + make_experiences(
        1, group_size=1, seed=5, prompt=200, max_response=3))  # fmt: skip
    assert model_inputs(short, shape).attention_mask is not None
    assert model_inputs(uneven, shape).attention_mask is None
    packed, padded = layout_flops(short, dataclasses.replace(shape, varlen_attention=True))
    assert packed < padded  # with a varlen kernel packing never loses
