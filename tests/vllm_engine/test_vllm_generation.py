"""The vllm engine's generation contract on the real engine (the shared tiny float32 model): groups of n
samples come back whole for several prompts at once; each sample's log-probs are the trainer's on the
same tokens (the HF model in float32, log_softmax(logits / T)) at temperature 1 and below; token ids
decode to the text; a stop string ends a sample (finish reason stop) and max_tokens truncates one
(finish reason length, exactly max_tokens tokens)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.explorer.fakes import sampling
from tests.vllm_engine.conftest import TOLERANCE, trainer_logprobs

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROMPTS = ("1+2=", "7*8 is", "The sum of 12 and 30")


def _prompts(engine) -> list[list[int]]:
    return [engine.tokenizer.encode(p) for p in PROMPTS]


async def test_groups_of_n_come_back_whole_for_several_prompts(vllm_engine):
    prompts = _prompts(vllm_engine)
    outs = await vllm_engine.generate(prompts, sampling(n=8, max_tokens=6))
    assert [len(group) for group in outs] == [8] * len(prompts)
    for prompt, group in zip(prompts, outs, strict=True):
        for out in group:
            assert out.prompt_token_ids == prompt and 1 <= len(out.token_ids) <= 6
            assert out.logprobs.shape == (len(out.token_ids),) and (out.logprobs <= 0).all()
            assert out.model_version == vllm_engine.model_version and out.token_model_versions is None
        assert len({tuple(o.token_ids) for o in group}) > 1  # n samples, not one sample n times


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_are_the_trainers_on_the_same_tokens(vllm_engine, hf_base, temperature):
    prompts = _prompts(vllm_engine)[:2]
    outs = await vllm_engine.generate(prompts, sampling(n=4, max_tokens=12, temperature=temperature))
    for prompt, group in zip(prompts, outs, strict=True):
        for out in group:
            want = trainer_logprobs(hf_base, prompt, out.token_ids, temperature)
            torch.testing.assert_close(out.logprobs, want, rtol=0, atol=TOLERANCE)
    if temperature != 1.0:  # the temperature is applied: at T=1 the same tokens score otherwise
        out = outs[0][0]
        at_one = trainer_logprobs(hf_base, prompts[0], out.token_ids, 1.0)
        assert (out.logprobs - at_one).abs().max() > 1e-2


async def test_token_ids_decode_to_the_text(vllm_engine):
    outs = await vllm_engine.generate(_prompts(vllm_engine), sampling(n=2, max_tokens=10))
    for out in (o for group in outs for o in group):
        assert out.text == vllm_engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)


async def test_a_stop_string_ends_the_sample(vllm_engine):
    """Stop strings: the ten digits (about a third of the tiny vocabulary's tokens hold one). A sample
    ends at the token that completes the first digit (finish reason stop), its text cut before it; a
    sample without a digit runs to max_tokens."""
    tok = vllm_engine.tokenizer
    digits = tuple("0123456789")
    outs = await vllm_engine.generate([tok.encode("1+2=")], sampling(n=8, max_tokens=32, stop=digits))
    stopped = 0
    for out in outs[0]:
        full = tok.decode(out.token_ids, skip_special_tokens=True)
        first = min((full.find(d) for d in digits if d in full), default=-1)
        assert len(out.logprobs) == len(out.token_ids)
        if out.finish_reason == "length":
            assert first == -1 and len(out.token_ids) == 32
            continue
        stopped += 1
        assert out.finish_reason == "stop" and first >= 0 and out.text == full[:first]
        before = tok.decode(out.token_ids[:-1], skip_special_tokens=True)
        assert not any(d in before for d in digits)  # the last token completed the first digit
    assert stopped > 0


async def test_max_tokens_truncates_with_finish_reason_length(vllm_engine):
    prompts = _prompts(vllm_engine)
    outs = await vllm_engine.generate(prompts, sampling(n=8, max_tokens=7, ignore_eos=True))
    for out in (o for group in outs for o in group):
        assert len(out.token_ids) == 7 and len(out.logprobs) == 7 and out.finish_reason == "length"
    # without ignore_eos a sample ends at the end-of-sequence token (stop) or at max_tokens (length)
    outs = await vllm_engine.generate(prompts, sampling(n=8, max_tokens=7))
    for out in (o for group in outs for o in group):
        if out.finish_reason == "length":
            assert len(out.token_ids) == 7
        else:
            assert out.finish_reason == "stop" and out.token_ids[-1] == vllm_engine.tokenizer.eos_token_id
