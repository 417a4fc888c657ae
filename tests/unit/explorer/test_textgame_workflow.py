"""The `textarena` workflow on real TextArena games (GuessTheNumber, single-player, no download): the
model's turns are trained and the game's messages masked out, a refused move earns the per-turn
reward and the game's own final reward ends the episode; the same seed plays the same game and the
process's `random` is left alone; the tiny model plays a group; bad names and a missing library say
what to do."""

from __future__ import annotations

import random
import sys

import pytest

from services.common.config import FormatConfig
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.tasks import Task
from services.explorer.workflows import ENVIRONMENTS, WORKFLOWS
from services.explorer.workflows.text_games import TextArenaEnvironment

from .fakes import ScriptedEngine, sampling

pytest.importorskip(
    "textarena", reason="!!! the `textarena` extra is not installed (scripts/setup.sh installs it)"
)


def _task(raw, workflow_args, **kw) -> Task:
    kw.setdefault("sampling", sampling(max_tokens=16))
    return Task(
        task_id="games/0",
        index=0,
        taskset="games",
        raw=raw,
        workflow="textarena",
        format=FormatConfig(),
        workflow_args=workflow_args,
        **kw,
    )


def _target(seed: int) -> int:
    probe = TextArenaEnvironment(game="GuessTheNumber-v0-raw")
    probe.reset(_task({"seed": seed}, {}))
    try:
        return int(probe.env.game_number)
    finally:
        probe.close()


async def test_a_game_masks_its_messages_and_gives_per_turn_and_final_rewards():
    target = _target(4)
    wrong = 20 if target < 20 else 1
    engine = ScriptedEngine([f"[{wrong}]", "oops", f"[{target}]", "[never]"])
    wrapper = ModelWrapper(engine)
    args = {"game": "GuessTheNumber-v0-raw", "invalid_move_reward": -0.1, "max_turns": 6}
    args["max_response_tokens"] = 2000
    random.seed(99)
    outer = random.getstate()
    result = await WorkflowRunner(wrapper).run(_task({"seed": 4}, args))
    assert random.getstate() == outer  # the game kept to its own random state
    assert result.ok, result
    [exp] = result.experiences
    text = wrapper.tokenizer.decode(exp.tokens.tolist())
    assert text.startswith("user: You are Player 0. You are playing Guess The Number.")
    hint = "lower" if wrong > target else "higher"
    assert f"assistant: [{wrong}]\nuser: The target number is {hint}.\nassistant: oops\n" in text
    assert "user: You attempted an invalid move." in text and text.endswith(f"assistant: [{target}]")
    response = exp.tokens[exp.prompt_length :].tolist()
    mask = exp.action_mask.tolist()
    said = "".join(chr(t) for t, m in zip(response, mask, strict=True) if m)
    assert said == f"[{wrong}]oops[{target}]"
    assert (exp.logprobs[~exp.action_mask] == 0).all()
    # per turn: 0 for a valid wrong guess, -0.1 for the refused move; final: the game's 1 for a win
    assert exp.reward == pytest.approx(0.9) and not exp.truncated and exp.metrics["turns"] == 3
    ends = [i for i in range(len(mask)) if mask[i] and (i + 1 == len(mask) or not mask[i + 1])]
    assert exp.token_level_rewards[ends].tolist() == pytest.approx([0.0, -0.1, 1.0])
    assert exp.info["game_reason"].startswith("Congratulations") and exp.metrics["accuracy"] == 0.0


async def test_running_out_of_turns_is_truncated_and_the_same_seed_plays_the_same_game():
    assert _target(11) == _target(11)
    engine = ScriptedEngine(["[1]", "[2]"])
    args = {"game": "GuessTheNumber-v0-raw", "max_turns": 2, "max_response_tokens": 2000}
    raw = {"seed": 11} if _target(11) not in (1, 2) else {"seed": 12}
    [exp] = (await WorkflowRunner(ModelWrapper(engine)).run(_task(raw, args))).experiences
    assert exp.truncated and exp.reward == 0.0 and exp.metrics["turns"] == 2
    assert exp.token_level_rewards is None  # nothing rewarded before the last turn


async def test_the_tiny_model_plays_a_group_of_games(hf_engine):
    task = _task(
        {"seed": 3},
        {"game": "GuessTheNumber-v0-raw", "max_turns": 3},
        repeat_times=2,
        sampling=sampling(temperature=1.0, max_tokens=4),
    )
    result = await WorkflowRunner(ModelWrapper(hf_engine)).run(task)
    assert result.ok and len(result.runs) == 2
    for exp in result.experiences:
        assert exp.action_mask.shape == exp.logprobs.shape == (exp.response_length,)
        assert exp.action_mask.any() and (exp.logprobs[~exp.action_mask] == 0).all()
        assert 1 <= exp.metrics["turns"] <= 3 and -1.0 <= exp.reward <= 1.0


def test_names_and_a_missing_library(monkeypatch):
    assert WORKFLOWS.get("textarena").default_env == "textarena"
    assert ENVIRONMENTS.get("textarena") is TextArenaEnvironment
    with pytest.raises(ValueError, match=r"no game 'GuessTheNumbr-v0-raw'.*GuessTheNumber-v0-raw"):
        TextArenaEnvironment(game="GuessTheNumbr-v0-raw")
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if the package were not installed
    with pytest.raises(ImportError, match=r"install the `textarena` extra"):
        TextArenaEnvironment()
