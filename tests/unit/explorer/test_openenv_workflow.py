"""The `openenv` workflow against a real OpenEnv server process (examples/openenv_server.py, written
with OpenEnv's server kit, on a free loopback port) through the library's own WebSocket client: the
model's turns are trained and the server's observations masked out, per-turn and final rewards come
from the server, `done` ends the episode; on the tiny model too; a missing library names the extra."""

from __future__ import annotations

import random
import sys

import pytest

from services.common.config import FormatConfig
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.tasks import Task
from services.explorer.workflows import ENVIRONMENTS, WORKFLOWS
from services.explorer.workflows.openenv_env import OpenEnvEnvironment, observation_text
from tests.support.openenv_server import OpenEnvServer

from .fakes import ScriptedEngine, sampling

pytest.importorskip(
    "openenv.core", reason="!!! the `openenv` extra is not installed (scripts/setup.sh installs it)"
)


# OpenEnv's client opens its WebSocket with websockets' sync `connect()` outside a `with` block
pytestmark = pytest.mark.filterwarnings(
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
)


@pytest.fixture(scope="module")
def server():
    with OpenEnvServer.start() as running:
        yield running


def _task(raw, workflow_args, **kw) -> Task:
    kw.setdefault("sampling", sampling(max_tokens=16))
    return Task(
        task_id="openenv/0",
        index=0,
        taskset="openenv",
        raw=raw,
        workflow="openenv",
        format=FormatConfig(),
        workflow_args=workflow_args,
        **kw,
    )


async def test_an_episode_masks_the_server_turns_and_takes_its_rewards(server):
    target = random.Random(5).randint(1, 9)  # the example server's number for seed 5
    wrong = [str(g) for g in (1, 2, 3, 6) if g != target][:2]
    engine = ScriptedEngine([wrong[0], wrong[1], str(target), "never said"])
    wrapper = ModelWrapper(engine)
    args = {"base_url": server.url, "observation_key": "prompt", "max_turns": 5, "max_response_tokens": 400}
    result = await WorkflowRunner(wrapper).run(_task({"seed": 5}, args))
    assert result.ok, result
    [exp] = result.experiences
    text = wrapper.tokenizer.decode(exp.tokens.tolist())
    lower_or_higher = ["Higher." if int(g) < target else "Lower." for g in wrong]
    assert text == (
        "user: Guess my number between 1 and 9. You have 4 tries.\n"
        f"assistant: {wrong[0]}\nuser: {lower_or_higher[0]}\n"
        f"assistant: {wrong[1]}\nuser: {lower_or_higher[1]}\n"
        f"assistant: {target}"
    )
    response = exp.tokens[exp.prompt_length :].tolist()
    mask = exp.action_mask.tolist()
    said = "".join(chr(t) for t, m in zip(response, mask, strict=True) if m)
    assert said == f"{wrong[0]}{wrong[1]}{target}"
    assert (exp.logprobs[~exp.action_mask] == 0).all() and (exp.logprobs[exp.action_mask] == -0.5).all()
    # two well-formed wrong guesses (0.1 each, per turn) and the right one (1.0): done, not truncated
    assert exp.reward == pytest.approx(1.2) and not exp.truncated and exp.metrics["turns"] == 3
    ends = [i for i in range(len(mask)) if mask[i] and (i + 1 == len(mask) or not mask[i + 1])]
    per_token = exp.token_level_rewards
    assert per_token is not None and per_token.shape == (len(response),)
    assert per_token[ends].tolist() == pytest.approx([0.1, 0.1, 1.0])
    assert float(per_token.sum()) == pytest.approx(exp.reward)


async def test_without_an_observation_key_the_model_reads_every_field(server):
    engine = ScriptedEngine(["no number"])
    wrapper = ModelWrapper(engine)
    args = {"base_url": server.url, "max_turns": 2, "max_response_tokens": 400}
    [exp] = (await WorkflowRunner(wrapper).run(_task({"seed": 1}, args))).experiences
    text = wrapper.tokenizer.decode(exp.tokens.tolist())
    assert text.startswith("user: prompt: Guess my number between 1 and 9. You have 4 tries.\nguesses: 0\n")
    assert "user: prompt: Say a number.\nguesses: 1\n" in text
    assert exp.reward == 0.0 and exp.truncated and exp.token_level_rewards is None
    assert observation_text({"a": "x", "b": [1, 2]}) == "a: x\nb: [1, 2]"
    with pytest.raises(KeyError, match="no field 'missing'"):
        observation_text({"a": 1}, "missing")


async def test_the_tiny_model_plays_a_group_of_episodes(server, hf_engine):
    task = _task(
        {"seed": 2},
        {"base_url": server.url, "observation_key": "prompt", "max_turns": 3},
        repeat_times=2,
        sampling=sampling(temperature=1.0, max_tokens=4),
    )
    result = await WorkflowRunner(ModelWrapper(hf_engine)).run(task)
    assert result.ok and len(result.runs) == 2
    for exp in result.experiences:
        assert exp.action_mask.shape == exp.logprobs.shape == (exp.response_length,)
        assert exp.action_mask.any() and (exp.logprobs[~exp.action_mask] == 0).all()
        assert (exp.logprobs[exp.action_mask] <= 0).all() and 1 <= exp.metrics["turns"] <= 3
        assert 0.0 <= exp.reward <= 1.3


def test_registered_by_name_and_a_missing_library_names_the_extra(monkeypatch):
    assert WORKFLOWS.get("openenv").default_env == "openenv"
    assert ENVIRONMENTS.get("openenv") is OpenEnvEnvironment
    monkeypatch.setitem(sys.modules, "openenv.core", None)  # as if the package were not installed
    with pytest.raises(ImportError, match=r"install the `openenv` extra"):
        OpenEnvEnvironment(base_url="http://127.0.0.1:9")
