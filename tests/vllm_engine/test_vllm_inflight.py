"""In-flight weight updates on the real vLLM engine (`set_inflight_updates(True)`): a load while requests
run pauses the engine (running requests aborted with what they sampled), loads and resumes; each cut
sample is resubmitted from its prompt plus its tokens and reaches its full length, its tokens' versions
switch from the old version to the new within the sample, and the log-probs of each part are those of
the weights that sampled it (the trainer's, within 1e-5). A request arriving while the engine is paused
waits, then runs on the new version.

The load starts once every request has produced a token: `TokenWatch` sees vLLM's engine-core outputs
as the engine's output handler hands them over, so the tests wait on an event, not on time. Samples
ignore the end-of-sequence token and ask for many tokens, so none can end before the load lands.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.unit.explorer.fakes import sampling
from tests.vllm_engine.conftest import TOLERANCE, hf_model, restore_weights, trainer_logprobs

pytestmark = pytest.mark.asyncio(loop_scope="session")

MAX_TOKENS = 48
PROMPTS = ("1+2=", "7*8 is")


class TokenWatch:
    """Sets `event` once `count` engine-core requests have each produced a token (vLLM's
    `OutputProcessor.process_outputs`, called by the engine's output handler, is observed)."""

    def __init__(self, engine, count: int):
        self.processor, self.count = engine.llm.output_processor, count
        self.started: set[str] = set()
        self.event = asyncio.Event()

    def __enter__(self) -> TokenWatch:
        process = self.processor.process_outputs

        def observed(outputs, *args, **kwargs):
            self.started.update(o.request_id for o in outputs if o.new_token_ids)
            if len(self.started) >= self.count:
                self.event.set()
            return process(outputs, *args, **kwargs)

        self.processor.process_outputs = observed
        return self

    def __exit__(self, *exc) -> None:
        del self.processor.process_outputs  # the class's method again


def _new_weights(model_dir, seed: int):
    """New weights for the whole model (a tied pair stays tied) and the trainer's model holding them."""
    model = hf_model(model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model


async def test_a_load_mid_generation_cuts_and_continues_every_sample_on_the_new_weights(
    vllm_engine, vllm_model_dir, hf_base
):
    engine = vllm_engine
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    state, new = _new_weights(vllm_model_dir, seed=21)
    updates = engine.stats()["inflight_updates"]
    engine.set_inflight_updates(True)
    try:
        with TokenWatch(engine, count=2 * len(prompts)) as watch:  # n=2: one engine-core request per sample
            task = asyncio.create_task(
                engine.generate(prompts, sampling(n=2, max_tokens=MAX_TOKENS, ignore_eos=True))
            )
            await asyncio.wait_for(watch.event.wait(), 120)
            await engine.load_weights(state.items(), version=1)
            assert engine.model_version == 1 and not task.done()
            outs = await asyncio.wait_for(task, 300)
        assert engine.stats()["inflight_updates"] == updates + 1
        for prompt, group in zip(prompts, outs, strict=True):
            assert len(group) == 2
            for out in group:
                versions = out.token_model_versions
                assert len(out.token_ids) == MAX_TOKENS and out.finish_reason == "length"
                assert versions is not None and 1 in versions
                cut = versions.index(1)
                assert 0 < cut < MAX_TOKENS and versions == [0] * cut + [1] * (MAX_TOKENS - cut)
                assert out.model_version == 0 and len(out.logprobs) == MAX_TOKENS
                old_part = trainer_logprobs(hf_base, prompt, out.token_ids[:cut])
                new_part = trainer_logprobs(new, prompt + out.token_ids[:cut], out.token_ids[cut:])
                torch.testing.assert_close(out.logprobs[:cut], old_part, rtol=0, atol=TOLERANCE)
                torch.testing.assert_close(out.logprobs[cut:], new_part, rtol=0, atol=TOLERANCE)
                assert out.text == engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    finally:
        await restore_weights(engine, vllm_model_dir)


async def test_a_request_arriving_while_paused_waits_and_runs_on_the_new_version(vllm_engine, vllm_model_dir):
    engine = vllm_engine
    prompt = engine.tokenizer.encode(PROMPTS[0])
    state, new = _new_weights(vllm_model_dir, seed=22)
    paused = asyncio.Event()
    pause = engine.llm.pause_generation

    async def observed_pause(**kwargs):
        await pause(**kwargs)
        paused.set()

    engine.llm.pause_generation = observed_pause
    engine.set_inflight_updates(True)
    try:
        load = asyncio.create_task(engine.load_weights(state.items(), version=1))
        await asyncio.wait_for(paused.wait(), 60)
        late = asyncio.create_task(engine.generate([prompt], sampling(n=2, max_tokens=8, ignore_eos=True)))
        assert not load.done()  # the request arrives while the engine is paused for the load
        await asyncio.wait_for(load, 60)
        ((a, b),) = await asyncio.wait_for(late, 60)
        for out in (a, b):
            assert out.model_version == 1 and out.token_model_versions == [1] * 8
            want = trainer_logprobs(new, prompt, out.token_ids)
            torch.testing.assert_close(out.logprobs, want, rtol=0, atol=TOLERANCE)
    finally:
        del engine.llm.pause_generation
        await restore_weights(engine, vllm_model_dir)
