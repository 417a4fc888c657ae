"""Token-by-token streaming and top log-probs of the `hf` engine: the per-row `on_token` callback
(services/explorer/engines/hf_generate.py), the `IncrementalDecoder` (services/explorer/serve/
streaming.py) and `top_logprobs` read from the distribution each token was sampled from."""

from __future__ import annotations

import torch

from services.explorer.serve.streaming import IncrementalDecoder

from .fakes import sampling

PROMPTS = [[5, 9, 13, 2], [7, 3]]


async def _generate(engine, params, **kwargs):
    engine.reseed(11)
    return await engine.generate(PROMPTS, params, **kwargs)


async def test_streamed_tokens_are_the_final_tokens_and_the_callback_changes_nothing(hf_engine):
    params = sampling(temperature=0.9, top_p=0.95, max_tokens=12, n=2, ignore_eos=True)
    plain = await _generate(hf_engine, params)
    seen: dict[tuple[int, int], list[tuple[int, float, object]]] = {}
    streamed = await _generate(
        hf_engine, params, on_token=lambda p, c, t, lp, top: seen.setdefault((p, c), []).append((t, lp, top))
    )
    for p, (a_group, b_group) in enumerate(zip(plain, streamed, strict=True)):
        for c, (a, b) in enumerate(zip(a_group, b_group, strict=True)):
            assert a.token_ids == b.token_ids and torch.equal(a.logprobs, b.logprobs) and a.text == b.text
            assert [t for t, _, _ in seen[(p, c)]] == b.token_ids
            assert torch.allclose(torch.tensor([x for _, x, _ in seen[(p, c)]]), b.logprobs)
            assert a.top_logprobs is None and all(top is None for _, _, top in seen[(p, c)])
    tops: dict[tuple[int, int], list] = {}
    asked = await _generate(
        hf_engine, params, top_logprobs=3,
        on_token=lambda p, c, t, lp, top: tops.setdefault((p, c), []).append(top),
    )  # fmt: skip
    for p, group in enumerate(asked):  # the streamed top k of each token is the recorded one
        for c, out in enumerate(group):
            assert tops[(p, c)] == out.top_logprobs


async def test_top_logprobs_are_sorted_k_entries_that_agree_with_the_sampled_token(hf_engine):
    for params in (
        sampling(temperature=0.7, top_k=20, max_tokens=10, ignore_eos=True),
        sampling(temperature=0.0, max_tokens=6, ignore_eos=True),
        sampling(temperature=1.3, top_p=0.9, max_tokens=10, ignore_eos=True),
    ):
        plain = await _generate(hf_engine, params)
        asked = await _generate(hf_engine, params, top_logprobs=4)
        hits = 0
        for a, b in zip((o for g in plain for o in g), (o for g in asked for o in g), strict=True):
            assert a.token_ids == b.token_ids and torch.equal(a.logprobs, b.logprobs)  # same samples
            assert len(b.top_logprobs) == len(b.token_ids)
            for tok, lp, top in zip(b.token_ids, b.logprobs.tolist(), b.top_logprobs, strict=True):
                assert len(top) == 4
                values = [x for _, x in top]
                assert values == sorted(values, reverse=True)
                assert lp <= values[0] + 1e-6
                entry = dict(top).get(tok)
                if entry is not None:
                    hits += 1
                    assert abs(entry - lp) < 1e-6
                else:
                    assert lp <= values[-1] + 1e-6
        assert hits > 0
        if params.temperature == 0:  # greedy: the sampled token is the most likely one
            for out in (o for g in asked for o in g):
                assert [top[0][0] for top in out.top_logprobs] == out.token_ids


def test_the_decoder_never_splits_a_multi_byte_character(hf_engine):
    tok = hf_engine.tokenizer
    text = "héllo 日本語 ünïcödé ok"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # characters spread over several byte tokens
    dec = IncrementalDecoder(tok)
    deltas = [dec.push(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas) and sum(1 for d in deltas if d) > 3
    assert "".join(deltas) + dec.finish(tok.decode(ids, skip_special_tokens=True)) == text


def test_the_decoder_holds_back_what_could_start_a_stop_string(hf_engine):
    tok = hf_engine.tokenizer
    text = "one two STOP three"
    ids = tok.encode(text, add_special_tokens=False)
    dec = IncrementalDecoder(tok, stops=("STOP", "twx"))
    sent = ""
    for i in ids:
        sent += dec.push(i)
        assert "STOP" not in sent and not sent.endswith(("S", "ST", "STO", "tw"))
        assert "one two ".startswith(sent)
    assert sent == "one two " and dec.stopped
    assert dec.finish("one two ") == ""
