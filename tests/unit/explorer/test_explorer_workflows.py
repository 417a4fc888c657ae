"""Workflows: math with the rewards library, the arithmetic quickstart on the tiny model, multi_turn
masking of observation tokens, plug-ins by dotted path, prompt truncation."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.common.config import FormatConfig
from services.explorer.model_wrapper import ModelWrapper, PromptTooLong
from services.explorer.runner import WorkflowRunner
from services.explorer.tasks import Task
from services.explorer.workflows import WORKFLOWS, workflow_class
from services.explorer.workflows.arithmetic import arithmetic_reward, make_arithmetic_rows
from services.explorer.workflows.multi_turn import GuessNumberEnv

from .fakes import ScriptedEngine, sampling


def _task(raw, workflow="math", **kw) -> Task:
    fmt = kw.pop("format", FormatConfig(prompt_key="question", response_key="answer"))
    kw.setdefault("sampling", sampling(max_tokens=16))  # what the config resolves; engines have no default
    return Task(task_id="t/0", index=0, taskset="t", raw=raw, workflow=workflow, format=fmt, **kw)


async def test_math_workflow_scores_each_sample_with_the_named_reward():
    engine = ScriptedEngine(["so #### 7", "#### 8", "no idea"])
    task = _task(
        {"question": "3+4?", "answer": "7"},
        repeat_times=3,
        reward_fn="gsm8k",
        sampling=sampling(max_tokens=20),
    )
    result = await WorkflowRunner(ModelWrapper(engine)).run(task)
    assert result.ok and len(result.runs) == 1
    exps = result.runs[0]
    assert [e.reward for e in exps] == [1.0, 0.0, 0.0]
    assert [e.metrics["accuracy"] for e in exps] == [1.0, 0.0, 0.0]
    prompt, params = engine.calls[0]
    assert params.n == 3 and params.max_tokens == 20
    assert ModelWrapper(engine).tokenizer.decode(prompt) == "user: 3+4?\nassistant: "
    e = exps[0]
    assert e.prompt_length == len(prompt) and e.response_text == "so #### 7"
    assert e.action_mask.all() and e.logprobs.shape == (len(e.tokens) - e.prompt_length,)


async def test_math_workflow_uses_data_source_and_math_verify():
    engine = ScriptedEngine(["The answer is \\boxed{\\frac{1}{2}}"])
    task = _task(
        {"question": "half?", "answer": "0.5", "data_source": "lighteval/MATH"},
        sampling=sampling(max_tokens=64),
    )
    exps = (await WorkflowRunner(ModelWrapper(engine)).run(task)).runs[0]
    assert exps[0].reward == 1.0


def test_arithmetic_reward_and_rows():
    assert arithmetic_reward("12<eos>", "12") == 1.0
    assert arithmetic_reward(" 13", "12") == 0.1
    assert arithmetic_reward("abc", "12") == 0.0
    rows = make_arithmetic_rows(5, seed=1)
    assert len(rows) == 5 and all(eval(r["question"][:-1]) == int(r["answer"]) for r in rows)


async def test_arithmetic_workflow_on_the_tiny_model(hf_engine):
    task = _task(
        {"question": "3+4=", "answer": "7"},
        workflow="arithmetic",
        repeat_times=4,
        sampling=sampling(temperature=1.0, max_tokens=6),
    )
    result = await WorkflowRunner(ModelWrapper(hf_engine)).run(task)
    assert result.ok
    exps = result.experiences
    assert len(exps) == 4
    prompt_ids = hf_engine.tokenizer.encode("3+4=", add_special_tokens=False)
    for e in exps:
        assert e.tokens[: e.prompt_length].tolist() == prompt_ids
        assert 0 < e.response_length <= 6 and e.logprobs.shape == (e.response_length,)
        assert e.reward in (0.0, 0.1, 1.0) and (e.logprobs <= 0).all()


class ScriptedEnv:
    """Two wrong guesses, then done."""

    def __init__(self):
        self.actions = []

    def reset(self, task):
        return "start"

    async def step(self, action):
        self.actions.append(action)
        return f"obs{len(self.actions)}", 0.5, len(self.actions) >= 3


async def test_multi_turn_masks_observation_tokens():
    engine = ScriptedEngine(["a1", "b22", "c333"])
    wrapper = ModelWrapper(engine)
    env = ScriptedEnv()
    task = _task(
        {"question": "q"},
        workflow="multi_turn",
        workflow_args={"env": lambda: env, "max_turns": 5},
        sampling=sampling(max_tokens=16),
    )
    exps = (await WorkflowRunner(wrapper).run(task)).experiences
    assert len(exps) == 1
    e = exps[0]
    assert env.actions == ["a1", "b22", "c333"] and e.reward == 1.5 and not e.truncated
    text = wrapper.tokenizer.decode(e.tokens.tolist())
    assert text == "user: start\nassistant: a1\nuser: obs1\nassistant: b22\nuser: obs2\nassistant: c333"
    response = e.tokens[e.prompt_length :].tolist()
    mask = e.action_mask.tolist()
    model_text = "".join(chr(t) for t, m in zip(response, mask, strict=True) if m)
    obs_text = "".join(chr(t) for t, m in zip(response, mask, strict=True) if not m)
    assert model_text == "a1b22c333"
    assert obs_text == "\nuser: obs1\nassistant: \nuser: obs2\nassistant: "
    lp = e.logprobs
    assert torch.equal(lp[e.action_mask], torch.full((9,), -0.5)) and torch.equal(
        lp[~e.action_mask], torch.zeros(len(obs_text))
    )


async def test_multi_turn_guess_number_on_the_tiny_model(hf_engine):
    task = _task(
        {"question": "", "target": 3},
        workflow="multi_turn",
        repeat_times=2,
        workflow_args={"max_turns": 3},
        sampling=sampling(max_tokens=4),
    )
    result = await WorkflowRunner(ModelWrapper(hf_engine)).run(task)
    assert result.ok and len(result.runs) == 2  # can_repeat False: one run per sample
    for e in result.experiences:
        assert e.action_mask.shape == e.logprobs.shape == (e.response_length,)
        assert (e.logprobs[~e.action_mask] == 0).all() and e.metrics["turns"] >= 1


def test_guess_number_env():
    env = GuessNumberEnv(0, 9)
    assert "between 0 and 9" in env.reset(_task({"target": 5}))
    assert env.step("4") == ("Higher.", 0.0, False)
    assert env.step("hm") == ("Say a number.", 0.0, False)
    assert env.step("5") == ("Correct!", 1.0, True)


async def test_prompt_truncation_keeps_the_tail_or_refuses():
    engine = ScriptedEngine(["x"])
    exps = await ModelWrapper(engine, max_prompt_tokens=5).generate_async(
        ["abcdefgh"], sampling(max_tokens=4)
    )
    assert engine.calls[-1][0] == [ord(c) for c in "defgh"] and exps[0].info["prompt_truncated"] == "1"
    strict = ModelWrapper(engine, max_prompt_tokens=5, enable_prompt_truncation=False)
    with pytest.raises(PromptTooLong):
        await strict.generate_async(["abcdefgh"], sampling(max_tokens=4))
    task = _task({"question": "a long question"}, workflow="math")
    result = await WorkflowRunner(strict, max_retry_times=3).run(task)
    assert not result.ok and result.attempts == 1 and "max_prompt_tokens" in result.error


class SyncEcho:
    """A sync plug-in workflow (runs in a worker thread and calls the model synchronously)."""

    is_async = False
    can_repeat = False
    requires_ground_truth = False

    def __init__(self, *, task, model, auxiliary_models=None):
        self.task, self.model = task, model

    def run(self):
        exps = self.model.generate([self.task.raw["question"]], self.task.sampling, max_tokens=3)
        for e in exps:
            e.reward = 0.25
        return exps


async def test_sync_plug_in_workflow_runs_in_a_thread():
    WORKFLOWS.add("test_explorer_sync_echo", SyncEcho)
    assert workflow_class("test_explorer_sync_echo") is SyncEcho
    engine = ScriptedEngine(["hello"])
    wrapper = ModelWrapper(engine, loop=asyncio.get_running_loop())
    result = await WorkflowRunner(wrapper).run(
        _task({"question": "hi"}, workflow="test_explorer_sync_echo", repeat_times=2)
    )
    assert result.ok and [e.response_text for e in result.experiences] == ["hel", "hel"]
    with pytest.raises(RuntimeError, match="event loop thread"):
        wrapper.generate(["x"])
    assert workflow_class("services.explorer.workflows.math:MathWorkflow").__name__ == "MathWorkflow"


async def test_plaintext_prompt_type_skips_the_chat_template():
    engine = ScriptedEngine(["#### 7"])
    fmt = FormatConfig(
        prompt_key="question", response_key="answer", prompt_type="plaintext", reply_prefix=" A:"
    )
    task = _task({"question": "3+4?", "answer": "7"}, reward_fn="gsm8k", format=fmt)
    exps = (await WorkflowRunner(ModelWrapper(engine)).run(task)).experiences
    assert engine.calls[0][0] == [ord(c) for c in "3+4? A:"] and exps[0].reward == 1.0
