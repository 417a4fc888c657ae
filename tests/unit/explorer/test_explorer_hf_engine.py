"""The hf engine: log-probs equal a teacher-forced forward pass of the sampling distribution,
seeded generation repeats, rows stop early, stop strings/ids, min_tokens, batching and weight loads."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.explorer.engines.hf import HFEngine
from services.weight_sync import WeightLoadError

from .fakes import sampling


def _prompts(engine: HFEngine) -> list[list[int]]:
    tok = engine.tokenizer
    texts = ["1+2=", "the answer is 123+456=", "7", "what is the sum of 3 and 4", "12*3="]
    return [tok.encode(t) for t in texts]


def _reference_logprobs(model, prompt, response, temperature, top_k=-1, top_p=1.0) -> torch.Tensor:
    """Teacher-forced: one forward pass over prompt + response, filtered with a per-position loop."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    out = []
    for pos, token in enumerate(response):
        row = logits[pos].clone()
        order = torch.argsort(row, descending=True)
        keep = order if top_k <= 0 else order[:top_k]
        probs = torch.softmax(row[keep], -1)
        if top_p < 1:
            mass, n = 0.0, 0
            while n < len(keep) and mass < top_p:
                mass += float(probs[n])
                n += 1
            keep = keep[:n]
        masked = torch.full_like(row, float("-inf"))
        masked[keep] = row[keep]
        out.append(torch.log_softmax(masked, -1)[token])
    return torch.stack(out).float()


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.3, 20, 1.0), (0.9, -1, 0.8), (1.0, 50, 0.9)],
)
def test_logprobs_equal_teacher_forced_forward(hf_engine, temperature, top_k, top_p):
    prompts = _prompts(hf_engine)  # different lengths: left padding inside one micro-batch
    params = sampling(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=12, n=2)
    outs = hf_engine.generate_sync(prompts, params)
    assert [len(g) for g in outs] == [2] * len(prompts)
    for prompt, group in zip(prompts, outs, strict=True):
        for o in group:
            assert o.prompt_token_ids == prompt
            assert len(o.token_ids) == len(o.logprobs) > 0
            ref = _reference_logprobs(hf_engine.model, prompt, o.token_ids, temperature, top_k, top_p)
            assert torch.isfinite(o.logprobs).all()
            torch.testing.assert_close(o.logprobs, ref, atol=1e-4, rtol=0)


def test_seeded_generation_is_reproducible(tiny_model_dir):
    a = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=123)
    b = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=123)
    c = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=124)
    prompts = _prompts(a)
    params = sampling(temperature=1.0, max_tokens=10, n=3)
    ra, rb, rc = (e.generate_sync(prompts, params) for e in (a, b, c))
    ids = lambda r: [[o.token_ids for o in g] for g in r]  # noqa: E731
    assert ids(ra) == ids(rb)
    assert ids(ra) != ids(rc)
    a.reseed(5)
    b.reseed(5)
    assert ids(a.generate_sync(prompts, params)) == ids(b.generate_sync(prompts, params))


def test_greedy_matches_argmax_and_rows_stop_on_their_own_limits(hf_engine):
    prompts = _prompts(hf_engine)
    params = [sampling(temperature=0, max_tokens=3 + i) for i in range(len(prompts))]
    outs = hf_engine.generate_sync(prompts, params)
    for i, (prompt, group) in enumerate(zip(prompts, outs, strict=True)):
        o = group[0]
        assert len(o.token_ids) == 3 + i and o.finish_reason == "length" and o.truncated
        ids = torch.tensor([prompt + o.token_ids])
        with torch.no_grad():
            logits = hf_engine.model(ids).logits[0, len(prompt) - 1 : -1]
        assert logits.argmax(-1).tolist() == o.token_ids


def test_stop_token_ids_end_rows_early_and_min_tokens_holds(hf_engine):
    prompt = _prompts(hf_engine)[1]
    greedy = hf_engine.generate_sync([prompt], sampling(temperature=0, max_tokens=8))[0][0]
    stop_at = greedy.token_ids[2]
    first = greedy.token_ids.index(stop_at)
    out = hf_engine.generate_sync([prompt], sampling(temperature=0, max_tokens=8, stop_token_ids=(stop_at,)))
    o = out[0][0]
    assert o.finish_reason == "stop" and o.token_ids == greedy.token_ids[: first + 1]
    held = hf_engine.generate_sync(
        [prompt], sampling(temperature=0, max_tokens=8, min_tokens=6, stop_token_ids=(stop_at,))
    )[0][0]
    assert stop_at not in held.token_ids[:5] and len(held.token_ids) >= 6


def test_stop_string_cuts_text(hf_engine):
    prompt = _prompts(hf_engine)[0]
    greedy = hf_engine.generate_sync([prompt], sampling(temperature=0, max_tokens=10))[0][0]
    stop = greedy.text[3:5]
    assert stop
    o = hf_engine.generate_sync([prompt], sampling(temperature=0, max_tokens=10, stop=(stop,)))[0][0]
    assert o.finish_reason == "stop" and stop not in o.text and greedy.text.startswith(o.text)
    assert len(o.token_ids) <= len(greedy.token_ids)


async def test_concurrent_requests_are_batched_and_keep_their_order(tiny_model_dir):
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=3)
    prompts = _prompts(engine)
    params = sampling(temperature=0, max_tokens=5)
    results = await asyncio.gather(*(engine.generate([p], params) for p in prompts))
    expected = engine.generate_sync(prompts, params)
    assert [r[0][0].token_ids for r in results] == [g[0].token_ids for g in expected]
    assert engine.stats()["batches"] < len(prompts) + 1  # concurrent callers shared batches


async def test_load_weights_changes_outputs_and_version(tiny_model_dir):
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=3)
    prompt = _prompts(engine)[0]
    params = sampling(temperature=0, max_tokens=6)
    before = (await engine.generate([prompt], params))[0][0]
    assert before.model_version == 0
    named = [(n, torch.randn_like(p) * 0.5) for n, p in engine.model.named_parameters()]
    await engine.load_weights(named, version=3)
    after = (await engine.generate([prompt], params))[0][0]
    assert after.model_version == 3 and engine.model_version == 3
    assert torch.equal(dict(engine.model.named_parameters())[named[0][0]], named[0][1])
    with pytest.raises(WeightLoadError, match="unknown tensor"):
        await engine.load_weights([("nope.weight", torch.zeros(1))], version=4)
    assert engine.model_version == 3
