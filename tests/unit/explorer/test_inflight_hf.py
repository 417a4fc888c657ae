"""In-flight weight updates on the hf engine: a version lands between decode steps of a running batch,
tokens before it carry the old version and tokens after it the new one, the tokens after it are what
the new weights sample from that prefix, and every log-prob is under the weights that sampled it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from services.explorer.engines.hf import HFEngine

from .fakes import sampling

MAX_TOKENS = 12


def _engine(tiny_model_dir, *, lean: bool = True, inflight: bool = True, seed: int = 7) -> HFEngine:
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=seed, lean_decoder=lean)
    engine.set_inflight_updates(inflight)
    return engine


def _new_weights(engine: HFEngine, seed: int = 1) -> dict[str, torch.Tensor]:
    """The engine's weights, each moved by seeded noise of its own scale (a different policy)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in engine.model.state_dict().items():
        noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
        out[name] = t + 0.5 * (t.float().std().nan_to_num(0.0) + 1e-2) * noise
    return out


def _prompts(engine: HFEngine) -> list[list[int]]:
    return [engine.tokenizer.encode(t) for t in ("1+2=", "the answer is 123+456=", "7")]


def _generate_with_update_at(engine: HFEngine, prompts, params, weights, after: int):
    """Generate; once `after` tokens of the first row are sampled, offer `weights` as version 1."""
    seen = [0]

    def on_token(prompt, choice, token, logprob, top):
        if prompt == 0 and choice == 0:
            seen[0] += 1
            if seen[0] == after:
                engine.offer_weights(weights.items(), 1)

    return asyncio.run(engine.generate(prompts, params, on_token=on_token))


def _teacher_forced(model, prompt, response, temperature) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
def test_tokens_after_an_update_are_what_the_new_weights_produce(tiny_model_dir, lean):
    engine = _engine(tiny_model_dir, lean=lean)
    weights = _new_weights(engine)
    prompts = _prompts(engine)  # several lengths: left padding in the batch
    params = sampling(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    after = 4
    outs = _generate_with_update_at(engine, prompts, params, weights, after)
    assert engine.model_version == 1
    assert engine.stats()["inflight_updates"] == 1

    # the reference: an engine that always had the new weights, greedy from each row's prefix
    reference = _engine(tiny_model_dir, lean=lean, inflight=False)
    reference.load_weights_sync(weights.items(), 1)
    for prompt, (out,) in zip(prompts, outs, strict=True):
        versions = out.token_model_versions
        assert versions == [0] * after + [1] * (MAX_TOKENS - after)
        assert out.model_version == 0  # the version the response started with
        prefix = out.token_ids[:after]
        (ref,) = reference.generate_sync([prompt + prefix], params.replace(max_tokens=MAX_TOKENS - after))[0]
        assert out.token_ids[after:] == ref.token_ids


def test_logprobs_are_under_the_weights_that_sampled_each_token(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    old_model = _engine(tiny_model_dir, inflight=False).model
    weights = _new_weights(engine, seed=2)
    temperature, after = 0.8, 5
    params = sampling(temperature=temperature, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = _prompts(engine)
    outs = _generate_with_update_at(engine, prompts, params, weights, after)
    new_model = engine.model  # holds the new weights now
    for prompt, (out,) in zip(prompts, outs, strict=True):
        assert out.token_model_versions == [0] * after + [1] * (MAX_TOKENS - after)
        old = _teacher_forced(old_model, prompt, out.token_ids, temperature)
        new = _teacher_forced(new_model, prompt, out.token_ids, temperature)
        torch.testing.assert_close(out.logprobs[:after], old[:after], atol=1e-4, rtol=0)
        torch.testing.assert_close(out.logprobs[after:], new[after:], atol=1e-4, rtol=0)
        assert not torch.allclose(old[after:], new[after:], atol=1e-3)  # the versions differ


def test_async_load_returns_once_applied_mid_generation(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    weights = _new_weights(engine, seed=3)
    params = sampling(temperature=1.0, max_tokens=40, ignore_eos=True)
    prompt = _prompts(engine)[0]

    async def main():
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        count = [0]

        def on_token(p, c, token, logprob, top):
            count[0] += 1
            if count[0] == 2:
                loop.call_soon_threadsafe(started.set)
                # hold this step until the load has offered its weights (polling, with a deadline)
                deadline = time.monotonic() + 30
                while engine.offered_version is None and time.monotonic() < deadline:
                    time.sleep(0.001)  # ok-sleep: polling the offer with a deadline

        task = asyncio.create_task(engine.generate([prompt], params, on_token=on_token))
        await started.wait()
        await engine.load_weights(weights.items(), 7)
        assert engine.model_version == 7 and engine.offered_version is None
        return await task

    ((out,),) = asyncio.run(main())
    assert out.token_model_versions[:2] == [0, 0]
    assert set(out.token_model_versions) == {0, 7}
    assert out.token_model_versions == sorted(out.token_model_versions)
    assert engine.stats()["inflight_updates"] == 1


def test_load_with_no_batch_running_applies_at_once(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    weights = _new_weights(engine, seed=4)
    done = threading.Event()

    def load():
        engine.load_weights_sync(weights.items(), 3)
        done.set()

    worker = threading.Thread(target=load)
    worker.start()
    worker.join(timeout=60)
    assert done.is_set() and engine.model_version == 3
    assert engine.stats()["inflight_updates"] == 0
    ((out,),) = engine.generate_sync([_prompts(engine)[0]], sampling(temperature=0.0, max_tokens=4))
    assert out.model_version == 3 and set(out.token_model_versions) == {3}
    torch.testing.assert_close(engine.model.state_dict()["lm_head.weight"], weights["lm_head.weight"])


def test_a_failed_in_flight_load_raises_and_keeps_the_version(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    bad = [("no.such.weight", torch.zeros(2))]
    with pytest.raises(Exception, match="unknown tensor"):
        engine.load_weights_sync(bad, 9)
    assert engine.model_version == 0 and engine.offered_version is None


def test_off_by_default_outputs_carry_no_per_token_versions(tiny_model_dir):
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=7)
    ((out,),) = engine.generate_sync([_prompts(engine)[0]], sampling(temperature=0.0, max_tokens=4))
    assert out.token_model_versions is None
    with pytest.raises(RuntimeError, match="in-flight"):
        engine.offer_weights([], 1)
