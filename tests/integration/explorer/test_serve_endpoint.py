"""The served endpoint (mode serve) on a real HTTP server on port 0 with the hf engine on the tiny
model, driven by the official `openai` client: chat (whole and streamed), n > 1, logprobs, errors in
the OpenAI shape, the bearer token, feedback and commit into experiences with the model's tokens
masked in; and the same Feedback/Commit over gRPC."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import httpx2
import openai
import pytest
import torch
from rft.v1 import explorer_pb2, explorer_pb2_grpc

from launcher.tiny_model import make_tiny_model
from services.common.config import load_config
from services.common.rpc import create_channel, start_server
from services.explorer.serve import responses
from services.explorer.serve.endpoint import Endpoint
from services.explorer.service import build_core
from services.explorer.servicer import ExplorerServicer, registration
from services.explorer.sink import ListSink
from tests.support.netproxy import NetProxy

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_model(tmp_path_factory.mktemp("serve") / "model")


@pytest.fixture
async def served(tmp_path, model_dir):
    config = load_config(
        text=f"""
mode: serve
checkpoint_root_dir: {tmp_path}/ckpt
model: {{model_path: {model_dir}, max_response_tokens: 8, max_prompt_tokens: 600}}
explorer: {{serve: {{max_tokens: 8, max_body_bytes: 8192, max_n: 4}}, rollout_model: {{micro_batch_size: 8}}}}
monitor: {{monitor_type: none}}
services: {{auth_token: {TOKEN}}}
"""
    )
    sink = ListSink()
    core = await build_core(config, sink=sink)
    endpoint = Endpoint(config, core)
    endpoint.start()
    client = openai.AsyncOpenAI(base_url=endpoint.http.url, api_key=TOKEN, max_retries=0)
    try:
        yield endpoint, client, sink, core
    finally:
        await client.close()
        await endpoint.stop()
        await core.close()


def _tokens(exp) -> list[int]:
    return exp.tokens.tolist()


async def test_a_conversation_with_feedback_and_commit_becomes_one_masked_experience(served):
    endpoint, client, sink, _ = served
    url = (endpoint.run_dir / "serve.url").read_text().strip()
    assert url == endpoint.http.url and url.startswith("http://127.0.0.1:")
    head = {"X-Session-Id": "conv-1"}
    messages = [{"role": "user", "content": "what is 2 plus 3"}]
    first = await client.chat.completions.create(
        model="policy", messages=messages, max_tokens=5, logprobs=True, extra_headers=head
    )
    assert first.model_extra["session_id"] == "conv-1"
    lp = first.choices[0].logprobs.content
    assert len(lp) == first.usage.completion_tokens > 0 and all(t.logprob <= 0 for t in lp)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and times 2"}]  # fmt: skip
    second = await client.chat.completions.create(
        model="policy", messages=messages, max_tokens=4, extra_headers=head
    )
    await client.post("/feedback", body={"session_id": "conv-1", "reward": 0.5}, cast_to=httpx2.Response)
    done = await client.post("/commit", body={"session_ids": ["conv-1"]}, cast_to=httpx2.Response)
    assert done.json()["experiences"] == 1 and done.json()["committed"] == ["conv-1"]
    [exp] = sink.experiences
    n1, n2 = first.usage.completion_tokens, second.usage.completion_tokens
    prompt = first.usage.prompt_tokens
    assert exp.prompt_length == prompt and exp.reward == 0.5
    assert len(_tokens(exp)) == second.usage.prompt_tokens + n2
    mask = exp.action_mask.tolist()
    between = second.usage.prompt_tokens - prompt - n1
    assert between > 0 and mask == [True] * n1 + [False] * between + [True] * n2
    assert torch.allclose(exp.logprobs[:n1], torch.tensor([t.logprob for t in lp]))
    assert (exp.logprobs[n1 : n1 + between] == 0).all()
    # exactly once: the same commit again is a retry and gets the first answer; another request
    # (here: its own idempotency key) committing the session is refused
    again = await client.post("/commit", body={"session_ids": ["conv-1"]}, cast_to=httpx2.Response)
    assert again.json() == done.json() and again.headers["idempotent-replayed"] == "true"
    with pytest.raises(openai.ConflictError) as err:
        await client.post("/commit", body={"session_ids": ["conv-1"]}, cast_to=httpx2.Response,
                          options={"headers": {"Idempotency-Key": "another"}})  # fmt: skip
    assert err.value.body["code"] == "committed" and err.value.body["param"] == "session_ids"
    assert len(sink.experiences) == 1


async def test_n_choices_stream_and_per_choice_rewards(served):
    _, client, sink, _ = served
    resp = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "count to three"}], n=3, max_tokens=4,
        temperature=1.0, user="grp",
    )  # fmt: skip
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for i in range(3):
        await client.post("/feedback", body={"response_id": resp.id, "choice_index": i, "reward": float(i)},
                          cast_to=httpx2.Response)  # fmt: skip
    stream = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Session-Id": "streamed"},
    )  # fmt: skip
    text, finish, usage = "", None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish in ("stop", "length") and usage is not None and usage.completion_tokens > 0
    await client.post("/feedback", body={"session_id": "streamed", "reward": 1.0}, cast_to=httpx2.Response)
    await client.post("/commit", body={"session_ids": ["grp", "streamed"]}, cast_to=httpx2.Response)
    group = sink.experiences[:3]
    assert [e.reward for e in group] == [0.0, 1.0, 2.0] and len({e.eid.group_id for e in group}) == 1
    assert sink.experiences[3].info["session_id"] == "streamed"
    assert sink.experiences[3].response_length == usage.completion_tokens


async def test_completions_models_and_health(served):
    endpoint, client, _, _ = served
    done = await client.completions.create(model="policy", prompt="the answer is", max_tokens=3)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.completion_tokens <= 3
    assert endpoint.core.store.sessions[done.id].calls[0].prompt_text == "the answer is"
    chunks = [
        c async for c in await client.completions.create(model="p", prompt="the", max_tokens=2, stream=True)
    ]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    recorded = endpoint.core.store.sessions[chunks[0].id].calls[0].choices[0].text
    assert "".join(c.choices[0].text for c in chunks) == recorded
    models = await client.models.list()
    assert [m.id for m in models.data] == [endpoint.core.model_name]
    async with httpx2.AsyncClient() as http:  # /health needs no token
        health = await http.get(endpoint.http.url.removesuffix("/v1") + "/health")
    assert health.json()["status"] == "ok" and health.json()["model_version"] == 0


async def test_a_token_id_prompt_answers_token_ids_and_log_probs_unrecorded(served):
    """The extras a token-level client (`rft serve tinker`) samples with: the prompt as token ids,
    `return_token_ids`, `top_k`, `stop_token_ids`, and `record: false` (no session is opened)."""
    endpoint, client, _, _ = served
    store = endpoint.core.store
    opened = store.open_count
    prompt = endpoint.core.tokenizer.encode("the answer is")
    body = {"model": "p", "prompt": prompt, "max_tokens": 4, "logprobs": 0, "return_token_ids": True,
            "record": False, "top_k": 1, "temperature": 1.0}  # fmt: skip
    first = (await client.post("/completions", body=body, cast_to=httpx2.Response)).json()
    [c] = first["choices"]
    assert first["prompt_token_ids"] == prompt and first["usage"]["prompt_tokens"] == len(prompt)
    assert len(c["token_ids"]) == len(c["logprobs"]["token_logprobs"]) == first["usage"]["completion_tokens"]
    assert all(lp <= 0 for lp in c["logprobs"]["token_logprobs"])
    assert store.open_count == opened and first["id"] not in store.sessions  # nothing recorded
    again = (await client.post("/completions", body=body, cast_to=httpx2.Response)).json()
    assert again["choices"][0]["token_ids"] == c["token_ids"]  # top_k 1: the same tokens
    stop = {**body, "max_tokens": 4, "stop_token_ids": [c["token_ids"][0]]}
    stopped = (await client.post("/completions", body=stop, cast_to=httpx2.Response)).json()
    assert stopped["choices"][0]["token_ids"] == c["token_ids"][:1]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    recorded = await client.completions.create(model="p", prompt=prompt, max_tokens=2)
    assert store.sessions[recorded.id].calls[0].prompt_ids == prompt  # recorded by default
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        await client.completions.create(model="p", prompt=[endpoint.core.engines[0].vocab_size], max_tokens=2)


async def test_streams_send_text_as_it_is_sampled_and_top_logprobs_come_back(served):
    endpoint, client, _, _ = served
    store = endpoint.core.store
    for k in range(6):  # a prompt whose answer has several tokens (the random model may end early)
        stream = await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": f"tell me {k}"}], max_tokens=8, n=2,
            temperature=1.0, stream=True, extra_headers={"X-Session-Id": f"live-{k}"},
        )  # fmt: skip
        deltas: dict[int, list[str]] = {0: [], 1: []}
        async for chunk in stream:
            for c in chunk.choices:
                if c.delta.content:
                    deltas[c.index].append(c.delta.content)
        choices = store.sessions[f"live-{k}"].calls[0].choices
        for c in choices:  # token by token, adding up to the recorded answer
            assert "".join(deltas[c.index]) == c.text
        if len(choices[0].token_ids) >= 4 and len(choices[0].text) >= 4:
            assert len(deltas[0]) > 1
            break
    else:
        raise AssertionError("no multi-token answer to stream")
    chat = await client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=5, logprobs=True, top_logprobs=3
    )
    for entry in chat.choices[0].logprobs.content:
        top = entry.top_logprobs
        assert len(top) == 3 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        same = [t.logprob for t in top if t.token == entry.token]
        assert not same or abs(same[0] - entry.logprob) < 1e-5
    done = await client.completions.create(model="p", prompt="the answer", max_tokens=4, logprobs=2)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == done.usage.completion_tokens
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == len("the answer")


async def test_streamed_log_probs_come_token_by_token_and_add_up_to_the_answer(served):
    """`stream` with `logprobs` (+ `top_logprobs`) is still token by token: each delta carries its own
    tokens' log-probs, and all of them together are the recorded answer's, in order."""
    endpoint, client, _, _ = served
    store = endpoint.core.store
    for k in range(6):
        sid = f"lp-live-{k}"
        stream = await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": f"count {k}"}], max_tokens=8, temperature=1.0,
            stream=True, logprobs=True, top_logprobs=2, extra_headers={"X-Session-Id": sid},
        )  # fmt: skip
        with_content, entries = 0, []
        async for chunk in stream:
            for c in chunk.choices:
                if c.logprobs is not None and c.logprobs.content:
                    entries += c.logprobs.content
                    with_content += 1
        recorded = store.sessions[sid].calls[0].choices[0]
        assert [e.logprob for e in entries] == pytest.approx(recorded.logprobs, abs=1e-6)
        assert all(len(e.top_logprobs) == 2 for e in entries)
        if len(recorded.token_ids) >= 4 and len(recorded.text) >= 4:
            assert with_content > 1  # more than one delta carried log-probs: not sent whole
            break
    else:
        raise AssertionError("no multi-token answer to stream")
    stream = await client.completions.create(
        model="p", prompt="the answer", max_tokens=6, logprobs=1, stream=True,
        extra_headers={"X-Session-Id": "lp-live-completion"},
    )  # fmt: skip
    tokens, offsets, lps = [], [], []
    async for chunk in stream:
        lp = chunk.choices[0].logprobs if chunk.choices else None
        if lp is not None:
            tokens += lp.tokens
            offsets += lp.text_offset
            lps += lp.token_logprobs
    recorded = store.sessions["lp-live-completion"].calls[0].choices[0]
    assert lps == pytest.approx(recorded.logprobs, abs=1e-6)
    assert offsets == [len("the answer") + len("".join(tokens[:j])) for j in range(len(tokens))]


async def test_a_client_leaving_mid_stream_does_not_break_the_batch(served):
    endpoint, client, _, _ = served
    store = endpoint.core.store
    msgs = [{"role": "user", "content": "a long story"}]
    stream = await client.chat.completions.create(
        model="p", messages=msgs, max_tokens=8, stream=True, extra_headers={"X-Session-Id": "gone"}
    )
    async for _chunk in stream:  # the role chunk, then leave
        break
    await stream.close()
    other = await client.chat.completions.create(
        model="p", messages=msgs, max_tokens=8, extra_headers={"X-Session-Id": "stays"}
    )
    assert other.usage.completion_tokens > 0
    assert store.sessions["stays"].calls[0].choices[0].text == other.choices[0].message.content
    for _ in range(100):  # the left call still finishes and is recorded as a whole answer
        if "gone" in store.sessions:
            break
        await endpoint.core.engines[0].generate([[1, 2]], endpoint.core.sampling.replace(max_tokens=1))
    assert len(store.sessions["gone"].calls[0].choices[0].token_ids) > 0


async def test_errors_name_the_field_and_nothing_is_recorded(served):
    endpoint, client, _, _ = served
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(max_tokens=9), "max_tokens", "explorer.serve.max_tokens"),
        (dict(n=5), "n", "explorer.serve.max_n"),
        (dict(temperature=-1), "temperature", "greater than or equal"),
        (dict(top_logprobs=2), "top_logprobs", "logprobs: true"),
        (dict(extra_body={"messages": [{"role": "wizard", "content": "x"}]}), "messages[0].role", "wizard"),
    ]
    for kwargs, param, words in cases:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model="p", messages=msgs, **kwargs)
        assert err.value.body["param"] == param and words in err.value.body["message"], err.value.body
        assert err.value.body["type"] == "invalid_request_error"
    long = [{"role": "user", "content": "the sum of " * 500}]
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="p", messages=long, max_tokens=2)
    assert err.value.body["code"] == "context_length_exceeded" and err.value.body["param"] == "messages"
    big = [{"role": "user", "content": "x" * 9000}]
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(model="p", messages=big)
    assert err.value.status_code == 413
    with pytest.raises(openai.NotFoundError) as err:
        await client.post("/commit", body={"session_ids": ["never-seen"]}, cast_to=httpx2.Response)
    assert "never-seen" in err.value.body["message"]
    assert endpoint.core.store.sessions == {}
    bad = openai.AsyncOpenAI(base_url=endpoint.http.url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        await bad.chat.completions.create(model="p", messages=msgs)
    assert err.value.body["param"] == "Authorization"
    await bad.close()


async def test_unrewarded_commit_is_refused_and_grpc_feedback_commit_work(served):
    endpoint, client, sink, core = served
    resp = await client.chat.completions.create(
        model="p",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_headers={"X-Session-Id": "g"},
    )
    with pytest.raises(openai.BadRequestError) as err:
        await client.post("/commit", body={"session_ids": ["g"]}, cast_to=httpx2.Response)
    assert err.value.body["code"] == "unrewarded" and "'g'" in err.value.body["message"]
    server = await start_server([registration(ExplorerServicer(core, serve=endpoint.core))], auth_token=TOKEN)
    channel = create_channel(server.address, auth_token=TOKEN, timeout_s=10)
    stub = explorer_pb2_grpc.ExplorerServiceStub(channel)
    try:
        fb = await stub.Feedback(explorer_pb2.ServeFeedbackRequest(response_id=resp.id, reward=2.0))
        assert fb.session_id == "g"
        out = await stub.Commit(explorer_pb2.ServeCommitRequest(session_ids=["g"]))
        assert out.experiences == 1 and list(out.committed) == ["g"] and list(out.model_versions) == [0]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Commit(explorer_pb2.ServeCommitRequest(session_ids=["g"]))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Commit(explorer_pb2.ServeCommitRequest(session_ids=["nope"]))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in err.value.details()
    finally:
        await channel.close()
        await server.stop(0)
    assert sink.experiences[-1].reward == 2.0


async def test_tools_are_rendered_into_the_prompt_and_tool_calls_parsed(served):
    endpoint, client, _, _ = served
    tools = [{"type": "function", "function": {"name": "calculator", "description": "adds",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]  # fmt: skip
    resp = await client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": "3+4?"}], tools=tools, max_tokens=3, user="tools"
    )
    [call] = endpoint.core.store.sessions["tools"].calls
    assert "calculator" in call.prompt_text and resp.choices[0].finish_reason in (
        "stop",
        "length",
        "tool_calls",
    )
    # a reply in the hermes format comes back as OpenAI tool_calls (the tiny model cannot write one)
    choice = call.choices[0]
    choice.text = 'ok <tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"}}\n</tool_call>'
    [answer] = endpoint.core._answers(endpoint.core._model(), [choice], tools=True)
    body = responses.chat_body(call, "tools", [answer], "p", logprobs=False)
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls" and message["content"] == "ok"
    [tc] = message["tool_calls"]
    assert tc["type"] == "function" and tc["function"]["name"] == "calculator"
    assert json.loads(tc["function"]["arguments"]) == {"expression": "3+4"} and tc["id"].startswith("call_")
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "x"}], tools=tools,
            tool_choice={"type": "function", "function": {"name": "calculator"}},
        )  # fmt: skip
    assert err.value.body["param"] == "tool_choice"


async def _episode(client, sid: str, key: str | None) -> None:
    """One call of an episode under its session id (and idempotency key, when given)."""
    head = {"X-Session-Id": sid} | ({"Idempotency-Key": key} if key else {})
    messages = [{"role": "user", "content": f"{sid}: what is 1 plus 1"}]
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=3, extra_headers=head)


async def test_a_lost_reply_is_retried_by_the_openai_client_and_stored_once(served):
    """A real proxy drops the first reply of each completion and of a commit; the official client
    retries (same body, same `Idempotency-Key`): one experience per episode. Without a key the same
    lost reply is sampled and recorded twice (two experiences for one episode)."""
    endpoint, _, sink, _ = served
    host, port = endpoint.http.url.removeprefix("http://").split("/")[0].split(":")
    with NetProxy.start(host, int(port)) as proxy:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key=TOKEN, max_retries=3
        )
        try:
            episodes = [f"ep-{i}" for i in range(3)]
            for i, sid in enumerate(episodes):
                proxy.drop_replies()
                await _episode(client, sid, key=f"key-{sid}")
                await client.post(
                    "/feedback", body={"session_id": sid, "reward": float(i)}, cast_to=httpx2.Response
                )
            proxy.drop_replies()
            done = await client.post("/commit", body={"session_ids": episodes}, cast_to=httpx2.Response)
            assert proxy.dropped == 4
            assert done.json()["experiences"] == 3 and done.headers["idempotent-replayed"] == "true"
            assert sorted(e.info["session_id"] for e in sink.experiences) == episodes
            assert [len(endpoint.core.store.sessions[s].calls) for s in episodes] == [0, 0, 0]  # committed
            # the control: no key, the lost reply's call stays in the session beside its retry's
            proxy.drop_replies()
            await _episode(client, "no-key", key=None)
            await client.post(
                "/feedback", body={"session_id": "no-key", "reward": 1.0}, cast_to=httpx2.Response
            )
            twice = await client.post("/commit", body={"session_ids": ["no-key"]}, cast_to=httpx2.Response)
            assert proxy.dropped == 5 and twice.json()["experiences"] == 2
        finally:
            await client.close()


async def test_an_idempotency_key_answers_concurrent_retries_once_and_refuses_another_request(served):
    endpoint, client, _, _ = served
    head = {"X-Session-Id": "same", "Idempotency-Key": "k-1"}
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    first, second = await asyncio.gather(
        *(client.chat.completions.with_raw_response.create(**body, extra_headers=head) for _ in range(2))
    )
    one, two = first.parse(), second.parse()
    assert one.id == two.id and one.choices[0].message.content == two.choices[0].message.content
    assert sorted(r.headers.get("idempotent-replayed", "") for r in (first, second)) == ["", "true"]
    assert len(endpoint.core.store.sessions["same"].calls) == 1
    with pytest.raises(openai.UnprocessableEntityError) as err:  # the key again, another request
        await client.chat.completions.create(**(body | {"max_tokens": 2}), extra_headers=head)
    assert err.value.body["param"] == "Idempotency-Key" and err.value.body["code"] == "idempotency_key_reused"
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(**body, extra_headers={"Idempotency-Key": "k" * 300})
    assert err.value.body["param"] == "Idempotency-Key"
    # streamed: the retry gets the same events
    stream_head = {"X-Session-Id": "streamed-once", "Idempotency-Key": "k-2"}
    texts = []
    for _ in range(2):
        stream = await client.chat.completions.create(**body, stream=True, extra_headers=stream_head)
        texts.append([c.id async for c in stream])
    assert texts[0] == texts[1] and len(endpoint.core.store.sessions["streamed-once"].calls) == 1
