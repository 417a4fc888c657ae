"""The chunked LM head (`trainer.logits_chunk_tokens`) gives the full-logits path's log-probs, entropy
and gradients: packed and padded rows, chunk sizes that do not divide the token count, tied
embeddings, a LoRA-wrapped policy, and the no-grad pass."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.modeling import load_model
from services.trainer.actor import policy_forward
from services.trainer.chunked_logprobs import supports_hidden_path
from services.trainer.collate import ModelShape, collate, model_inputs
from services.trainer.lora import LoraSettings, apply_lora
from tests.support.trainer_data import make_experiences

torch.set_num_threads(1)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def step():
    return collate(make_experiences(6, seed=5, max_response=20))


def _loss_and_grads(model, step, chunk_tokens, shape=None):
    """Log-probs, entropy and the gradients of a loss that reads both (entropy with its gradient)."""
    model.zero_grad(set_to_none=True)
    lp, ent = policy_forward(
        model, step, 0.7, CPU, entropy=True, entropy_grad=True, shape=shape, chunk_tokens=chunk_tokens
    )
    mask = step.batch.response_mask
    adv = torch.linspace(-1.0, 1.0, step.size)[:, None]
    loss = -(lp * adv * mask).sum() / mask.sum() - 0.01 * (ent * mask).sum() / mask.sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads


def _assert_same(a, b):
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = a, b
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=0)
    assert g_a.keys() == g_b.keys() and g_a
    for name in g_a:
        torch.testing.assert_close(g_a[name], g_b[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("padded", [False, True], ids=["packed", "padded"])
def test_chunked_head_equals_full_logits(model_dir, step, padded):
    model = load_model(model_dir, device="cpu").float().train()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: both gradients land on one
    assert supports_hidden_path(model)
    shape = ModelShape.of(model)
    if padded:
        shape = dataclasses.replace(shape, pair_flops=1e12)  # padding is then the cheaper layout
    assert (model_inputs(step, shape).attention_mask is not None) == padded
    tokens = int(step.batch.response_mask.sum())
    full = _loss_and_grads(model, step, 0, shape)
    for chunk in (7, tokens, 4096):  # 7 does not divide the token count
        assert chunk != 7 or tokens % 7
        _assert_same(_loss_and_grads(model, step, chunk, shape), full)
    with torch.no_grad():  # the old/ref log-prob pass
        lp_full, _ = policy_forward(model, step, 0.7, CPU, shape=shape)
        lp_chunked, ent = policy_forward(model, step, 0.7, CPU, shape=shape, chunk_tokens=5)
    assert ent is None
    torch.testing.assert_close(lp_chunked, lp_full, atol=1e-5, rtol=0)


def test_chunked_head_equals_full_logits_with_lora(model_dir, step):
    torch.manual_seed(0)
    model = apply_lora(load_model(model_dir, device="cpu").float(), LoraSettings(rank=4, alpha=8)).train()
    with torch.no_grad():  # B = 0 at the start: move it so the adapter changes the log-probs
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.05)
    assert supports_hidden_path(model)
    full = _loss_and_grads(model, step, 0)
    assert all(".lora_" in n for n in full[2])  # only the adapter is trained
    _assert_same(_loss_and_grads(model, step, 9), full)
