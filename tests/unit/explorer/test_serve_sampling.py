"""The served endpoint's sampling arguments: `model.*` from the config (via `Resolved.sampling_params`),
with the request's temperature, top_p, n, stop and token limit on top (services/explorer/serve/endpoint_core.py)."""

from __future__ import annotations

from services.common.config import load_config
from services.explorer.serve.endpoint_core import EndpointCore
from services.explorer.serve.protocol import CompletionRequest
from services.explorer.serve.sessions import SessionStore
from services.explorer.sink import ListSink

from .fakes import ScriptedEngine


async def test_the_endpoint_samples_with_the_model_section_and_the_requests_fields():
    config = load_config(
        text="mode: serve\nmodel: {model_path: /m, top_k: 5, repetition_penalty: 1.3, min_response_tokens: 1}\n"
        "explorer: {serve: {max_tokens: 6}}"
    )
    engine = ScriptedEngine(["7 and more"])
    backend = EndpointCore(config, [engine], ListSink(), SessionStore(), "policy")
    req = CompletionRequest(prompt="3+4=", temperature=0.5, n=2, stop="\n")
    _, _, answers = await backend.complete(req, None)
    params = engine.calls[-1][1]
    assert (params.top_k, params.repetition_penalty, params.min_tokens) == (5, 1.3, 1)  # model.*
    assert (params.temperature, params.n, params.stop, params.max_tokens) == (0.5, 2, ("\n",), 6)
    assert [a.choice.text for a in answers] == ["7 and ", "7 and "]
