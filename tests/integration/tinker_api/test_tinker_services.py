"""`rft serve tinker` backed by the services: a real synchronizer (memory sync, in this process) and
a real explorer in mode serve (hf engine, tiny model, in this process, following the synchronizer),
the tinker server as a subprocess pointed at both, driven by the official SDK: a base-model sample is
the explorer's, `save_weights_for_sampler` publishes the next version, the explorer comes to hold it,
and the sampled tokens' log-probs are those the training client computes for the same tokens."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from services.common.config import load_config
from services.common.config.sync_plan import SyncPlan
from services.common.rpc import start_server as start_grpc
from services.explorer.service import make_build
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.members import Role
from services.synchronizer.servicer import registration
from services.synchronizer.settings import SynchronizerSettings
from services.weight_sync import sync_method
from tests.support.rft_run import poll_until, tiny_model

from .conftest import API_KEY, start_server

pytestmark = pytest.mark.timeout(300)

PROMPT = [5, 6, 7, 8]


def _logprobs(tc, tokens: list[int]) -> np.ndarray:  # noqa: ANN001 - the SDK's TrainingClient
    """log p of tokens[1:] under the training client's weights (forward with cross_entropy)."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": np.asarray(tokens[1:], dtype=np.int64)},
    )
    return tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def _check_logprobs(tc, res) -> None:  # noqa: ANN001
    for seq in res.sequences:
        assert len(seq.tokens) == len(seq.logprobs) >= 1
        want = _logprobs(tc, PROMPT + list(seq.tokens))[len(PROMPT) - 1 :]
        np.testing.assert_allclose(np.asarray(seq.logprobs), want, atol=1e-4)


def drive(url: str, health: str, published) -> dict[str, float]:  # noqa: ANN001
    """The SDK side (a thread: the synchronizer and the explorer run on the test's event loop)."""
    sc = tinker.ServiceClient(base_url=url, api_key=API_KEY)
    tc = sc.create_lora_training_client(base_model="tiny", rank=8).result()
    params = types.SamplingParams(max_tokens=4, temperature=1.0)
    prompt = types.ModelInput.from_ints(PROMPT)
    base = sc.create_sampling_client(base_model="tiny").result()
    _check_logprobs(tc, base.sample(prompt, 2, params).result())  # version 0: the explorer's base model
    with pytest.raises(tinker.RequestFailedError, match=r"explorer\.serve\.max_tokens"):
        base.sample(prompt, 1, types.SamplingParams(max_tokens=64)).result()  # the explorer's own limit
    assert published() == 0
    seq = PROMPT + [9, 10]
    data = [types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={"target_tokens": np.asarray(seq[1:], dtype=np.int64)},
    )]  # fmt: skip
    for _ in range(3):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    start = time.monotonic()
    path = tc.save_weights_for_sampler("s1").result().path
    saved = time.monotonic()
    assert published() == 1  # the save published version 1 through the synchronizer
    poll_until(lambda: httpx.get(health).json()["model_version"] == 1, 60, "the explorer holding v1", 0.01)
    held = time.monotonic()
    res = sc.create_sampling_client(model_path=path).result().sample(prompt, 2, params).result()
    _check_logprobs(tc, res)  # the trained weights' log-probs, sampled by the explorer at version 1
    snapshot = tc.save_weights_and_get_sampling_client().result()  # the same weights again: version 2
    assert published() == 2
    _check_logprobs(tc, snapshot.sample(prompt, 1, params).result())
    before = _logprobs(tc, seq)
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert not np.allclose(_logprobs(tc, seq), before, atol=1e-4)  # the client moved on
    # the base model is no longer what the explorer holds: sampling it publishes it again (version 3)
    again = base.sample(prompt, 1, params).result()
    assert published() == 3 and httpx.get(health).json()["model_version"] == 3
    base_tc = sc.create_lora_training_client(base_model="tiny", rank=8).result()  # untrained: the base
    _check_logprobs(base_tc, again)
    return {"save_s": saved - start, "save_to_held_s": held - start}


async def test_save_for_sampler_publishes_and_the_explorer_samples_that_version(tmp_path: Path) -> None:
    model = tiny_model()
    sync = SynchronizerCore(
        SynchronizerSettings(method=sync_method("memory"), plan=SyncPlan("fixed", 1, 0), sync_timeout=60)
    )
    await sync.start()
    grpc = await start_grpc([registration(sync)], port=0)
    config = load_config(
        text=f"""
mode: serve
checkpoint_root_dir: {tmp_path}/ckpt
model: {{model_path: {model}, max_response_tokens: 8}}
explorer: {{serve: {{port: 0, max_tokens: 8}}}}
synchronizer: {{sync_method: memory, sync_style: fixed, sync_interval: 1, sync_timeout: 60}}
monitor: {{monitor_type: none}}
services: {{synchronizer: {{address: "{grpc.address}"}}}}
"""
    )
    _, close_explorer = await make_build()(config)
    proc = None
    try:
        url_file = next((tmp_path / "ckpt").rglob("run/serve.url"))
        explorer = url_file.read_text().strip()
        health = explorer.removesuffix("/v1") + "/health"
        extra = ("--synchronizer", grpc.address, "--explorer", explorer, "--explorer-model", "tiny")
        proc, url = await asyncio.to_thread(start_server, tmp_path, 0, *extra)
        trainers = [m.member_id for m in sync.members.values() if m.role == Role.TRAINER]
        assert trainers == ["tinker"]
        figures = await asyncio.to_thread(drive, url, health, lambda: sync.published.version)
        print(f"\nsave_weights_for_sampler {figures['save_s']:.2f} s; to the explorer holding it "
              f"{figures['save_to_held_s']:.2f} s")  # fmt: skip
    finally:
        if proc is not None:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        await close_explorer()
        await grpc.stop(0)
        await sync.close()
