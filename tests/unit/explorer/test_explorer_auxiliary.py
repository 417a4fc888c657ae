"""Auxiliary models over an OpenAI-compatible HTTP API (the official `openai` client) against a small
local /v1/chat/completions server written here, and an LLM-judge reward in the math workflow."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from services.common.config import FormatConfig, InferenceModelConfig
from services.explorer.auxiliary import LocalChatModel, OpenAIModel, build_auxiliary_models
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.tasks import Task

from .fakes import ScriptedEngine, sampling


class _Handler(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        last = body["messages"][-1]["content"]
        if "Candidate answer:" in last:
            reply = "0.8" if "Candidate answer: 7" in last else "score 0"
        else:
            reply = f"echo: {last}"
        payload = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.requests = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


async def test_openai_model_chat_async_and_sync(server, monkeypatch):
    monkeypatch.setenv("TEST_EXPLORER_KEY", "sekret")
    cfg = InferenceModelConfig(
        engine_type="openai", api_base=server, api_key_env="TEST_EXPLORER_KEY", name="judge"
    )
    (model,) = build_auxiliary_models([cfg])
    assert isinstance(model, OpenAIModel)
    assert await model.chat_async([{"role": "user", "content": "hi"}]) == "echo: hi"
    req = _Handler.requests[-1]
    assert (
        req["path"] == "/v1/chat/completions"
        and req["auth"] == "Bearer sekret"
        and req["body"]["model"] == "judge"
    )
    assert await asyncio.to_thread(model.chat, [{"role": "user", "content": "sync"}]) == "echo: sync"
    await model.close()
    monkeypatch.delenv("TEST_EXPLORER_KEY")
    with pytest.raises(RuntimeError, match="TEST_EXPLORER_KEY is empty"):
        OpenAIModel(cfg)


async def test_math_workflow_with_an_llm_judge(server):
    judge = OpenAIModel(InferenceModelConfig(engine_type="openai", api_base=server))
    task = Task(
        task_id="t/0", index=0, taskset="t", raw={"question": "3+4?", "answer": "7"}, workflow="math",
        format=FormatConfig(prompt_key="question", response_key="answer"), repeat_times=2,
        workflow_args={"judge": True, "correct_threshold": 0.5}, sampling=sampling(max_tokens=8),
    )  # fmt: skip
    result = await WorkflowRunner(ModelWrapper(ScriptedEngine(["7", "9"])), auxiliary_models=[judge]).run(
        task
    )
    assert result.ok
    assert [e.reward for e in result.experiences] == [0.8, 0.0]
    assert [e.metrics["accuracy"] for e in result.experiences] == [1.0, 0.0]
    await judge.close()


async def test_a_local_judge_samples_greedily_within_its_configured_limit():
    engine = ScriptedEngine(["0.5 yes"])
    cfg = InferenceModelConfig(model_path="judge", max_response_tokens=3)
    judge = LocalChatModel(ModelWrapper(engine), cfg, "explorer.auxiliary_models[0]")
    assert await judge.chat_async([{"role": "user", "content": "q"}]) == "0.5"
    params = engine.calls[-1][1]
    assert (params.temperature, params.max_tokens, params.n) == (0.0, 3, 1)
    assert await judge.chat_async([{"role": "user", "content": "q"}], temperature=0.5) == "0.5"
    assert engine.calls[-1][1].temperature == 0.5
    unset = LocalChatModel(
        ModelWrapper(engine), InferenceModelConfig(model_path="judge"), "explorer.auxiliary_models[1]"
    )
    with pytest.raises(ValueError, match=r"explorer\.auxiliary_models\[1\]\.max_response_tokens: not set"):
        await unset.chat_async([{"role": "user", "content": "q"}])
    assert await unset.chat_async([{"role": "user", "content": "q"}], max_tokens=2) == "0."
