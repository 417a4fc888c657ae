"""In-flight weight updates on the vllm engine, with vLLM replaced (runs in the main environment): an
update pauses the engine (abort mode, caches cleared), loads, sets the version and resumes; every sample
it cut is continued from its prompt plus the tokens it had, on the new version, and records per token
the version that sampled it. The vLLM names used are checked by scripts/check_vllm_api.py; the real
engine's in-flight updates by tests/vllm_engine/test_vllm_inflight.py."""

from __future__ import annotations

import asyncio

import torch

from services.explorer.engines.vllm import VLLMEngine, _Sample

from .fakes import CharTokenizer, sampling


class PausingLLM:
    """The AsyncLLM calls an in-flight update makes, recorded."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.events.append(f"pause({mode}, clear_cache={clear_cache})")

    async def resume_generation(self) -> None:
        self.events.append("resume")

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.events.append(method)
        return [0]

    async def reset_prefix_cache(self) -> None:
        self.events.append("reset_prefix_cache")

    def shutdown(self) -> None:
        pass


class ScriptedVLLM(VLLMEngine):
    """vLLM's sampling replaced: token = 1000 x version + its position in the sequence, one per loop
    turn; a request ends with finish_reason "abort" (and what it has) when an update pauses the engine."""

    async def _request(self, prompt, params):
        if self.inflight:  # as the engine's own: never send into a pause
            async with self._resumed:
                await self._resumed.wait_for(lambda: not self._paused)
        version, pauses = self._version, self._pauses
        rows: list[list[int]] = [[] for _ in range(params.n)]  # the n samples in step, as vLLM's batch
        reason = "length"
        while len(rows[0]) < params.max_tokens:
            if self._pauses != pauses:
                reason = "abort"
                break
            for ids in rows:
                ids.append(1000 * version + len(prompt) + len(ids))
            await asyncio.sleep(0)  # ok-sleep: one decode step per loop turn
        samples = [_Sample(ids, [-0.5 - version] * len(ids), reason, "") for ids in rows]
        return samples, version, self._pauses - pauses


def _engine() -> ScriptedVLLM:
    engine = ScriptedVLLM(PausingLLM(), CharTokenizer(), vocab_size=100_000)
    engine.set_inflight_updates(True)
    return engine


async def test_an_update_mid_generation_continues_each_sample_on_the_new_version():
    engine = _engine()
    prompt = [1, 2, 3]
    params = sampling(temperature=1.0, max_tokens=20, n=2)
    task = asyncio.create_task(engine.generate([prompt], params))
    for _ in range(5):  # a few decode steps run
        await asyncio.sleep(0)  # ok-sleep: let the generation take a few loop turns
    await engine.receive_weights(1)
    ((a, b),) = await task

    assert engine.model_version == 1
    assert engine.llm.events == ["pause(abort, clear_cache=True)", "rft_receive", "resume"]
    for out in (a, b):
        versions = out.token_model_versions
        cut = versions.index(1)
        assert 0 < cut < 20 and versions == [0] * cut + [1] * (20 - cut)
        # continued from its prompt plus the tokens it had: positions run on, on the new version
        assert out.token_ids == [len(prompt) + i + (1000 if i >= cut else 0) for i in range(20)]
        torch.testing.assert_close(out.logprobs, torch.tensor([-0.5] * cut + [-1.5] * (20 - cut)))
        assert out.model_version == 0 and out.finish_reason == "length"
    assert engine.stats()["inflight_updates"] == 1


async def test_without_in_flight_an_update_waits_for_running_generations():
    engine = _engine()
    engine.set_inflight_updates(False)
    task = asyncio.create_task(engine.generate([[1]], sampling(temperature=1.0, max_tokens=8)))
    await asyncio.sleep(0)  # ok-sleep: the generation starts
    await engine.receive_weights(2)
    assert task.done()  # the load waited for it
    ((out,),) = task.result()
    assert out.token_model_versions is None and out.model_version == 0
    assert engine.llm.events == ["rft_receive", "reset_prefix_cache"]


async def test_an_idle_in_flight_engine_loads_and_samples_on_the_new_version():
    engine = _engine()
    await engine.receive_weights(3)
    ((out,),) = await engine.generate([[1, 2]], sampling(temperature=1.0, max_tokens=3))
    assert out.token_model_versions == [3, 3, 3] and out.model_version == 3
