"""`model.repetition_penalty` and `model.min_response_tokens` reach the hf engine through the resolved
rollout args and act there: the penalty as transformers' `RepetitionPenaltyLogitsProcessor` (the
reference here), and EOS gets no probability before `min_tokens` tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from services.common.config import load_config, resolve
from services.common.modeling import load_model, load_tokenizer
from services.explorer.engines.hf import HFEngine
from services.explorer.engines.sampling import apply_repetition_penalty

from .fakes import sampling

CONFIG = """
model: {model_path: MODEL, max_response_tokens: 8, min_response_tokens: 5, repetition_penalty: 1.7}
explorer: {rollout_model: {ignore_eos: false}}
buffer: {explorer_input: {taskset: {path: tasks.jsonl}}}
"""


def _reference(model, prompt, response, temperature, penalty=1.0, eos=(), min_tokens=0) -> torch.Tensor:
    """Teacher-forced log-probs of `response`, penalised by transformers' own logits processor."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    processor = RepetitionPenaltyLogitsProcessor(penalty)
    out = []
    for pos, token in enumerate(response):
        row = logits[pos : pos + 1].clone()
        if pos < min_tokens and eos:
            row[0, list(eos)] = float("-inf")
        if penalty != 1.0:
            row = processor(ids[:, : len(prompt) + pos], row)
        out.append(torch.log_softmax(row[0] / temperature, -1)[token])
    return torch.stack(out)


def test_the_config_keys_reach_the_sampling_params(tmp_path):
    config = load_config(text=CONFIG.replace("MODEL", str(tmp_path)))
    res = resolve(config)
    params = res.sampling_params(res.tasksets[0])
    assert (params.min_tokens, params.repetition_penalty, params.max_tokens) == (5, 1.7, 8)


def test_penalty_of_one_changes_nothing_and_signs_are_handled():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = apply_repetition_penalty(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0]]
    assert torch.equal(apply_repetition_penalty(logits, seen, torch.tensor([1.0])), logits)


@pytest.mark.parametrize("penalty", [1.5, 0.7])
def test_repetition_penalty_logprobs_equal_transformers_processor(hf_engine, penalty):
    tok = hf_engine.tokenizer
    prompts = [tok.encode("1+1=1+1=1+1="), tok.encode("7 7 7"), tok.encode("the answer is")]
    params = [sampling(temperature=0.9, max_tokens=10, n=2, repetition_penalty=penalty, ignore_eos=True)] * 3
    params[2] = params[2].replace(repetition_penalty=1.0)  # rows with and without a penalty in one batch
    outs = hf_engine.generate_sync(prompts, params)
    for prompt, group, p in zip(prompts, outs, params, strict=True):
        for o in group:
            ref = _reference(hf_engine.model, prompt, o.token_ids, 0.9, penalty=p.repetition_penalty)
            torch.testing.assert_close(o.logprobs, ref, atol=1e-4, rtol=0)
    greedy = sampling(temperature=0, max_tokens=10, ignore_eos=True)
    plain = hf_engine.generate_sync(prompts[:1], greedy)[0][0]
    strong = hf_engine.generate_sync(prompts[:1], greedy.replace(repetition_penalty=50.0))[0][0]
    assert strong.token_ids != plain.token_ids
    assert len(set(strong.token_ids)) == len(strong.token_ids)  # a strong penalty never repeats a token


def test_min_tokens_gives_eos_no_probability_before_the_limit(tiny_model_dir):
    model, tokenizer = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    prompt = tokenizer.encode("1+2=")
    with torch.no_grad():
        favourite = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
    model.generation_config.eos_token_id = favourite  # EOS is the model's first choice: it would stop at once
    engine = HFEngine(model, tokenizer, seed=3, micro_batch_size=4)
    greedy = sampling(temperature=0, max_tokens=12)
    assert engine.generate_sync([prompt], greedy)[0][0].token_ids == [favourite]
    held = engine.generate_sync([prompt], greedy.replace(min_tokens=5))[0][0]
    assert len(held.token_ids) >= 5 and favourite not in held.token_ids[:5]
    sampled = engine.generate_sync([prompt], sampling(temperature=1.2, max_tokens=12, min_tokens=4, n=6))[0]
    for o in sampled:
        assert favourite not in o.token_ids[:4]
        ref = _reference(model, prompt, o.token_ids, 1.2, eos=(favourite,), min_tokens=4)
        torch.testing.assert_close(o.logprobs, ref, atol=1e-4, rtol=0)
