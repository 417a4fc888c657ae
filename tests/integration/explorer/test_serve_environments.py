"""One environment interface for `multi_turn`, the library adapters and serve mode: environments of
`ENVIRONMENTS` (the built-in guess_number and the adapter of an OpenEnv server process) played through
the served endpoint (a real HTTP server on port 0, the hf engine on the tiny model, the official
`openai` client) by `play_served_episode`: each episode is one session that commits into one
experience with only the model's tokens masked in and the environment's reward. (A TextArena game
plays the same way; its prompts are longer than the tiny model's 512 positions.)"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.config import load_config
from services.explorer.serve.endpoint import Endpoint
from services.explorer.service import build_core
from services.explorer.sink import ListSink
from services.explorer.workflows import ENVIRONMENTS
from services.explorer.workflows.served import play_served_episode

# OpenEnv's client opens its WebSocket with websockets' sync `connect()` outside a `with` block
pytestmark = pytest.mark.filterwarnings(
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_model(tmp_path_factory.mktemp("serve_envs") / "model")


@pytest.fixture
async def served(tmp_path, model_dir):
    config = load_config(
        text=f"""
mode: serve
checkpoint_root_dir: {tmp_path}/ckpt
model: {{model_path: {model_dir}, max_response_tokens: 6, max_prompt_tokens: 500}}
explorer: {{serve: {{max_tokens: 6}}, rollout_model: {{micro_batch_size: 4}}}}
monitor: {{monitor_type: none}}
"""
    )
    sink = ListSink()
    core = await build_core(config, sink=sink)
    endpoint = Endpoint(config, core)
    endpoint.start()
    client = openai.AsyncOpenAI(base_url=endpoint.http.url, api_key="unused", max_retries=0)
    try:
        yield client, sink
    finally:
        await client.close()
        await endpoint.stop()
        await core.close()


def _check(episode, sink) -> None:
    [exp] = sink.experiences
    assert episode.committed["committed"] == [episode.session_id] and episode.committed["experiences"] == 1
    assert exp.reward == pytest.approx(episode.reward)
    mask = exp.action_mask
    assert int(mask.sum()) == episode.completion_tokens > 0  # exactly the model's tokens are trained
    assert (exp.logprobs[~mask] == 0).all() and (exp.logprobs[mask] <= 0).all()
    turns = len(episode.rewards)
    assert 1 <= turns <= 3 and len(episode.messages) >= 1 + turns
    if turns > 1:
        assert not mask.all()  # the environment's observations between the turns are masked out


async def test_a_multi_turn_environment_plays_through_serve_mode(served):
    client, sink = served
    env = ENVIRONMENTS.get("guess_number")()
    episode = await play_served_episode(
        env, client, "guess-1", {"target": 7}, max_turns=3, max_tokens=4, temperature=1.0
    )
    _check(episode, sink)
    assert episode.messages[0]["content"] == "Guess my number between 0 and 9."


async def test_an_openenv_server_plays_through_serve_mode(served):
    pytest.importorskip("openenv.core", reason="!!! the `openenv` extra is not installed")
    from tests.support.openenv_server import OpenEnvServer

    client, sink = served
    with OpenEnvServer.start() as server:
        env = ENVIRONMENTS.get("openenv")(base_url=server.url, observation_key="prompt")
        episode = await play_served_episode(env, client, "openenv-1", {"seed": 1}, max_turns=3, max_tokens=4)
    _check(episode, sink)
    assert episode.messages[0]["content"].startswith("Guess my number between 1 and 9")
