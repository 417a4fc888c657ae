"""The official `tinker` SDK against `rft serve tinker`: every supported route, the error paths, the
RestClient's training runs and checkpoints, sampling through the `retrieve_futures` poll with cloned
sampling clients, an abandoned sample cancelled, sessions and their finish, and an SDK-only
SFT-then-RL loop on the quickstart's arithmetic task that must raise the reward."""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from services.common.modeling import load_tokenizer
from tests.support.rft_run import poll_until, tiny_model
from tests.support.tinker_loop import sft_then_rl

from .conftest import API_KEY

pytestmark = pytest.mark.timeout(300)

TOKENS = [5, 6, 7, 8, 9, 10]


def datum(tokens: list[int] = TOKENS, weights: list[float] | None = None) -> types.Datum:
    n = len(tokens) - 1
    w = np.ones(n, dtype=np.float32) if weights is None else np.asarray(weights, dtype=np.float32)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": np.asarray(tokens[1:], dtype=np.int64), "weights": w},
    )


def service(url: str, key: str = API_KEY) -> tinker.ServiceClient:
    return tinker.ServiceClient(base_url=url, api_key=key)


def test_every_supported_route_through_the_sdk(tinker_url: str) -> None:
    sc = service(tinker_url)
    caps = sc.create_rest_client().get_server_capabilities().result()
    names = {m.model_name for m in caps.supported_models}
    assert {"tiny", "tiny-full"} <= names
    tc = sc.create_lora_training_client(base_model="tiny", rank=8).result()
    info = tc.get_info()
    assert (info.is_lora, info.lora_rank, info.model_name) == (True, 8, "tiny")

    fwd = tc.forward([datum()], "cross_entropy").result()
    logprobs = fwd.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert logprobs.shape == (len(TOKENS) - 1,) and (logprobs < 0).all()
    fb = tc.forward_backward([datum()], "cross_entropy").result()
    np.testing.assert_allclose(fb.loss_fn_outputs[0]["logprobs"].to_numpy(), logprobs, rtol=1e-5)
    assert fb.metrics["loss:sum"] == pytest.approx(-logprobs.sum(), rel=1e-4)
    first = fb.metrics["loss:sum"]
    for step in range(1, 4):
        out = tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        assert out.metrics["step:max"] == step
        loss = tc.forward_backward([datum()], "cross_entropy").result().metrics["loss:sum"]
    assert loss < first  # AdamW steps on the adapter lower the loss of the trained example
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    trained = tc.forward([datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()

    state = tc.save_state("ck1").result().path
    assert state == f"tinker://{info.model_id}/weights/ck1"
    resumed = sc.create_training_client_from_state_with_optimizer(state).result()
    assert resumed.get_info().is_lora
    again = resumed.forward([datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(again, trained, rtol=1e-5)
    tc.forward_backward([datum()], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    tc.load_state(state).result()  # back to the saved weights
    back = tc.forward([datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(back, trained, rtol=1e-5)

    path = tc.save_weights_for_sampler("s1").result().path
    params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=3)
    for sampler in (
        sc.create_sampling_client(model_path=path),
        tc.save_weights_and_get_sampling_client(),
        sc.create_sampling_client(base_model="tiny"),
    ):
        res = sampler.sample(types.ModelInput.from_ints(TOKENS[:3]), 2, params).result()
        assert len(res.sequences) == 2
        for seq in res.sequences:
            assert 1 <= len(seq.tokens) <= 3 and len(seq.logprobs) == len(seq.tokens)
            assert all(lp <= 0 for lp in seq.logprobs)

    for loss, extra in (
        ("importance_sampling", {}),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("cispo", {}),
        ("gspo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("dro", {"beta": 0.1}),
    ):
        d = datum()
        n = len(TOKENS) - 1
        d.loss_fn_inputs.pop("weights")
        d.loss_fn_inputs["logprobs"] = types.TensorData.from_numpy(trained.astype(np.float32))
        d.loss_fn_inputs["advantages"] = types.TensorData.from_numpy(np.full(n, 0.5, dtype=np.float32))
        if loss == "gspo":  # the sequence ratio over the sampled tokens: all but the first here
            ratio_mask = np.ones(n, dtype=np.float32)
            ratio_mask[0] = 0.0
            d.loss_fn_inputs["sequence_ratio_mask"] = types.TensorData.from_numpy(ratio_mask)
        out = tc.forward_backward([d], loss, loss_fn_config=extra or None).result()
        # at ratio 1 (the sampler's log-probs are the current ones) IS, PPO and GSPO (its sequence
        # ratio too) are -sum(A); CISPO and DRO weigh log p by A (the clip at 1 and the penalty at 0)
        want = -0.5 * n if loss in ("importance_sampling", "ppo", "gspo") else -0.5 * float(trained.sum())
        assert out.metrics["loss:sum"] == pytest.approx(want, rel=1e-4)


def test_errors_reach_the_sdk_clearly(tinker_url: str) -> None:
    with pytest.raises(tinker.AuthenticationError, match="invalid API key"):
        service(tinker_url, "tml-wrong").get_server_capabilities()
    sc = service(tinker_url)
    with pytest.raises(tinker.RequestFailedError, match="base_model 'no-such-model' is neither"):
        sc.create_lora_training_client(base_model="no-such-model", rank=4).result()
    tc = sc.create_lora_training_client(base_model="tiny", rank=4).result()
    with pytest.raises(tinker.RequestFailedError, match=r"loss_fn 'stable_reinforce' is not supported.*gspo"):
        tc.forward_backward([datum()], "stable_reinforce").result()
    short = datum(weights=[1.0, 1.0])
    with pytest.raises(tinker.RequestFailedError, match=r"\['weights'\] has 2 values for 5 input tokens"):
        tc.forward_backward([short], "cross_entropy").result()
    bare = datum()
    with pytest.raises(tinker.RequestFailedError, match=r"needs loss_fn_inputs \['logprobs', 'advantages'\]"):
        tc.forward_backward([bare], "ppo").result()
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint at tinker://nope/weights/x"):
        tc.load_state("tinker://nope/weights/x").result()
    # a future the server never made (or has expired): 404 with the reason
    r = httpx.post(
        f"{tinker_url}/api/v1/retrieve_future",
        json={"request_id": "req-999999"},
        headers={"X-API-Key": API_KEY},
    )
    assert r.status_code == 404 and "unknown or expired future" in r.json()["detail"]
    # a route we do not serve: the SDK raises with our message, not a 500
    with pytest.raises(tinker.NotFoundError, match="not supported by rft serve tinker"):
        sc.create_rest_client().publish_checkpoint_from_tinker_path("tinker://run/weights/x").result()


def test_rest_client_training_runs_and_checkpoints(tinker_url: str) -> None:
    sc = service(tinker_url)
    tc = sc.create_lora_training_client(base_model="tiny", rank=4).result()
    run_id = tc.get_info().model_id
    tc.forward_backward([datum()], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    state = tc.save_state("a").result().path
    sampler = tc.save_weights_for_sampler("s", ttl_seconds=7200).result().path
    rest = sc.create_rest_client()

    runs = rest.list_training_runs(limit=100).result()
    assert run_id in [r.training_run_id for r in runs.training_runs]
    assert runs.cursor.total_count == len(runs.training_runs)
    assert runs.training_runs[0].training_run_id == run_id  # the most recently used first
    page = rest.list_training_runs(limit=1, offset=1).result()
    assert len(page.training_runs) == min(1, runs.cursor.total_count - 1) and page.cursor.offset == 1

    run = rest.get_training_run(run_id).result()
    assert (run.base_model, run.is_lora, run.lora_rank, run.model_owner) == ("tiny", True, 4, "rft")
    assert datetime.now(timezone.utc) - run.last_request_time < timedelta(minutes=1)
    assert run.last_checkpoint.tinker_path == state and run.last_sampler_checkpoint.tinker_path == sampler
    assert rest.get_training_run_by_tinker_path(sampler).result().training_run_id == run_id

    listed = rest.list_checkpoints(run_id).result().checkpoints
    kinds = {c.tinker_path: (c.checkpoint_type, c.checkpoint_id) for c in listed}
    assert kinds == {state: ("training", "weights/a"), sampler: ("sampler", "sampler_weights/s")}
    assert all(c.size_bytes > 0 for c in listed)
    # TTLs: the save's, then set_checkpoint_ttl's; None removes it; outside an hour..ten years: refused
    expiries = {c.tinker_path: c.expires_at for c in listed}
    assert expiries[state] is None
    assert abs(expiries[sampler] - datetime.now(timezone.utc) - timedelta(hours=2)) < timedelta(minutes=1)
    rest.set_checkpoint_ttl_from_tinker_path(state, 3600).result()
    rest.set_checkpoint_ttl_from_tinker_path(sampler, None).result()
    expiries = {c.tinker_path: c.expires_at for c in rest.list_checkpoints(run_id).result().checkpoints}
    assert expiries[sampler] is None
    assert abs(expiries[state] - datetime.now(timezone.utc) - timedelta(hours=1)) < timedelta(minutes=1)
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds 60: between 3600"):
        rest.set_checkpoint_ttl_from_tinker_path(state, 60).result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint at"):
        rest.set_checkpoint_ttl_from_tinker_path(f"tinker://{run_id}/weights/nope", 3600).result()
    mine = rest.list_user_checkpoints(limit=1000).result()  # every run's, the newest first
    everyone = [c.tinker_path for c in mine.checkpoints]
    assert {state, sampler} <= set(everyone) and everyone.index(sampler) < everyone.index(state)
    assert mine.cursor.total_count == len(everyone)
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert (info.base_model, info.is_lora, info.lora_rank) == ("tiny", True, 4)

    rest.delete_checkpoint(run_id, "weights/a").result()
    assert [c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints] == [sampler]
    assert rest.get_training_run(run_id).result().last_checkpoint is None
    with pytest.raises(tinker.RequestFailedError, match=f"no checkpoint at {state}"):
        tc.load_state(state).result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint at"):
        rest.delete_checkpoint_from_tinker_path(state).result()
    with pytest.raises(tinker.NotFoundError, match="unknown training run 'no-such-run'"):
        rest.get_training_run("no-such-run").result()
    with pytest.raises(tinker.NotFoundError, match="unknown training run 'no-such-run'"):
        rest.list_checkpoints("no-such-run").result()


def test_sdk_only_rl_loop_raises_the_quickstart_reward(tinker_url: str) -> None:
    sc = service(tinker_url)
    out = sft_then_rl(
        sc, load_tokenizer(tiny_model()), base_model="tiny-full", sft_steps=30, rl_steps=30, lr=1e-3
    )
    print(out)
    assert out["gain"] >= 0.3, out


def test_sampling_clients_poll_retrieve_futures_and_sessions_finish(tinker_url: str) -> None:
    sc = tinker.ServiceClient(base_url=tinker_url, api_key=API_KEY, user_metadata={"run": "t"})
    assert sc.holder.get_client_config().sample_use_retrieve_futures  # the server turns the poll on
    tc = sc.create_lora_training_client(base_model="tiny", rank=4).result()
    sampler = sc.create_sampling_client(base_model="tiny").result()
    params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=5)
    prompt = types.ModelInput.from_ints(TOKENS[:3])
    futures = [sampler.sample(prompt, 2, params) for _ in range(4)]  # one retrieve_futures poll for all
    results = [f.result() for f in futures]
    assert all(len(r.sequences) == 2 and r.sequences[0].tokens for r in results)
    # each result, once fetched, is reported retrieved on the next poll, and the server drops it
    fetched = results[0].sequences[0].sequence_id.rsplit("-", 1)[0]
    headers = {"X-API-Key": API_KEY}

    def gone() -> bool:
        r = httpx.post(f"{tinker_url}/api/v1/retrieve_future", json={"request_id": fetched}, headers=headers)
        return r.status_code == 404

    poll_until(gone, 30, f"the server dropping the retrieved result {fetched}")
    # the route itself: nothing new after the client's cursor; an unknown sampling session is a 404
    sid = sampler._sampling_session_id
    poll = {"target": {"sampling_session_id": sid}, "prev_cursor": 10**6, "timeout": 0}
    r = httpx.post(f"{tinker_url}/api/v1/retrieve_futures", json=poll, headers=headers)
    assert r.json() == {"completions": [], "cursor": 10**6}
    poll["target"] = {"sampling_session_id": "sampling-nope"}
    r = httpx.post(f"{tinker_url}/api/v1/retrieve_futures", json=poll, headers=headers)
    assert r.status_code == 404 and "unknown sampling_session_id" in r.json()["detail"]

    # clones of the sampling client (pickled, or rebuilt from its handle) join for their own clone ids
    clones = [pickle.loads(pickle.dumps(sampler)), tinker.SamplingClient.from_sampler_handle(
        sampler.get_sampler_handle(), api_key=API_KEY)]  # fmt: skip
    for clone in clones:
        assert len(clone.sample(prompt, 1, params).result().sequences) == 1
    assert sorted(c._cloned_sampler_id for c in clones) == [1, 2]

    rest = tinker.RestClient(base_url=tinker_url, api_key=API_KEY)
    session_id = sc.holder.get_session_id()
    got = rest.get_session(session_id).result()
    assert got.training_run_ids == [tc.get_info().model_id] and got.sampler_ids == [sid]
    assert got.user_metadata == {"run": "t"}
    assert session_id in rest.list_sessions(limit=100).result().sessions
    sc.close("success").result()  # POST sessions/<id>/finish: no new clients in that session
    body = {"session_id": session_id, "sampling_session_seq_id": 9, "base_model": "tiny"}
    r = httpx.post(f"{tinker_url}/api/v1/create_sampling_session", json=body, headers=headers)
    assert r.status_code == 400 and f"session {session_id!r} is finished (success)" in r.json()["detail"]
    with pytest.raises(tinker.NotFoundError, match="unknown session 'session-nope'"):
        rest.get_session("session-nope").result()


def test_an_abandoned_queued_sample_is_cancelled(tinker_url: str) -> None:
    sc = service(tinker_url)
    sampler = sc.create_sampling_client(base_model="tiny").result()
    headers = {"X-API-Key": API_KEY}
    # the one worker kept busy: eight long samples, queued (each POST returns once it is) before the SDK's;
    # whatever the machine's speed, the SDK's sample waits behind seven of them when it is cancelled
    blockers = []
    for i in range(8):
        busy = {"sampling_session_id": sampler._sampling_session_id, "seq_id": 999_999_990 + i,
                "num_samples": 64, "prompt": {"chunks": [{"type": "encoded_text", "tokens": TOKENS[:3]}]},
                "sampling_params": {"max_tokens": 128, "temperature": 1.0, "seed": 1}}  # fmt: skip
        blockers.append(httpx.post(f"{tinker_url}/api/v1/asample", json=busy, headers=headers).json()["request_id"])
    future = sampler.sample(types.ModelInput.from_ints(TOKENS[:3]), 1, types.SamplingParams(max_tokens=2))
    # the SDK has its request id once its poller waits on it; abandoning the future sends cancel_future
    poll_until(lambda: sampler._futures_poller and sampler._futures_poller._events, 30, "the SDK's wait")
    future.future().cancel()
    poll = {"target": {"sampling_session_id": sampler._sampling_session_id}, "prev_cursor": 0, "timeout": 20}
    done = httpx.post(f"{tinker_url}/api/v1/retrieve_futures", json=poll, headers=headers).json()
    assert [c["state"] for c in done["completions"]] == ["failed"]  # dropped before it ran
    cancelled = done["completions"][0]["request_id"]
    r = httpx.post(f"{tinker_url}/api/v1/retrieve_future", json={"request_id": cancelled}, headers=headers)
    assert r.json()["error"] == f"request {cancelled} was cancelled (cancel_future)"
    for rid in blockers[1:]:  # the queued blockers are dropped too, so the first is the last one to run
        httpx.post(f"{tinker_url}/api/v1/cancel_future", json={"request_id": rid}, headers=headers)
    for _ in range(6):  # each call waits up to 20 s for it, then answers try_again
        r = httpx.post(f"{tinker_url}/api/v1/retrieve_future", json={"request_id": blockers[0]}, headers=headers,
                       timeout=60)  # fmt: skip
        if r.headers["content-type"] != "application/json" or r.json().get("type") != "try_again":
            break
    assert r.headers["content-type"] == "application/x-protobuf"  # the first busy sample's result: it ran
