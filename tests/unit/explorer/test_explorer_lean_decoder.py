"""The lean forward pass equals the transformers forward (left padding, cache, dropped rows), and the
sampling loop draws the same tokens with either."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from services.common.modeling import load_model, load_tokenizer
from services.explorer.engines.hf_generate import HFGenerator, Row
from services.explorer.engines.lean_decoder import LeanDecoder, unsupported

from .fakes import sampling


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_model(tiny_model_dir).eval()


def test_lean_forward_equals_transformers_forward(model):
    g = torch.Generator().manual_seed(0)
    lengths = [3, 7, 5, 7]
    width = max(lengths)
    ids = torch.randint(3, 500, (4, width), generator=g)
    mask = torch.zeros(4, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, : width - n] = 0
        mask[i, width - n :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    lean = LeanDecoder(model)
    cache, hf_cache = lean.new_cache(4, width + 6), DynamicCache()
    step_ids, step_pos = ids, positions
    rows = torch.arange(4)
    with torch.no_grad():
        for t in range(6):
            ours = lean.forward(step_ids, step_pos, mask.bool(), cache)
            ref = model(
                input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=hf_cache
            ).logits[:, -1]
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
            nxt = ref.argmax(-1)
            step_pos = step_pos[:, -1:] + 1
            if t == 2:  # a row finished: both caches drop it
                keep = torch.tensor([0, 2, 3])
                rows, mask, step_pos, nxt = rows[keep], mask[keep], step_pos[keep], nxt[keep]
                cache.select(keep)
                hf_cache.batch_select_indices(keep)
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=-1)
            step_ids = nxt.unsqueeze(-1)


def test_sampling_draws_the_same_tokens_with_either_forward(model, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    prompts = [tok.encode(t) for t in ("1+2=", "the answer is 12+34=", "7")]
    rows = [
        Row(p, sampling(temperature=0.9, max_tokens=10, ignore_eos=True)) for p in prompts for _ in range(3)
    ]
    outs = {}
    for lean in (True, False):
        gen = HFGenerator(model, tok, seed=3, pad_token_id=0, lean_decoder=lean)
        assert (gen.lean is not None) is lean
        outs[lean] = gen.generate(rows)
    for a, b in zip(outs[True], outs[False], strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_unsupported_models_keep_the_transformers_forward():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    assert "model type" in unsupported(gpt2)
    scaled = Qwen2ForCausalLM(
        Qwen2Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=64,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        )
    )  # fmt: skip
    assert "rope" in unsupported(scaled)
    assert HFGenerator(gpt2, None, pad_token_id=0).lean is None
    with pytest.raises(ValueError, match="does not support"):
        LeanDecoder(gpt2)
