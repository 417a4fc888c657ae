"""The `verifiers` workflow with the real library: a `vf.SingleTurnEnv` (its dataset, parser and
rubric: examples/vf_envs/arithmetic_env.py) scored by its rubric; a `vf.MultiTurnEnv` whose
`env_response` messages are masked out of one token sequence; the tiny model plays a group; a missing
environment or library says what to do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.common.config import FormatConfig
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.tasks import Task
from services.explorer.workflows import WORKFLOWS
from services.explorer.workflows.verifiers_env import load_environment

from .fakes import ScriptedEngine, sampling

pytest.importorskip(
    "verifiers", reason="!!! the `verifiers` extra is not installed (scripts/setup.sh installs it)"
)
import verifiers as vf  # noqa: E402
from datasets import Dataset  # noqa: E402

ARITHMETIC = "arithmetic_env:load_environment"  # examples/vf_envs/arithmetic_env.py


@pytest.fixture(autouse=True)
def _example_plugin_dir(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3] / "examples" / "vf_envs"))


def _task(raw, workflow_args, index=0, **kw) -> Task:
    kw.setdefault("sampling", sampling(max_tokens=8))
    return Task(
        task_id=f"vf/{index}",
        index=index,
        taskset="vf",
        raw=raw,
        workflow="verifiers",
        format=FormatConfig(),
        workflow_args=workflow_args,
        **kw,
    )


def load_two_turns() -> vf.Environment:
    """Two model turns; the environment answers the first with a user message."""

    class TwoTurns(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            return [{"role": "user", "content": "again"}]

    dataset = Dataset.from_list([{"question": "say hi", "answer": "hi"}])

    def says_answer(completion, answer, **kwargs) -> float:
        said = [m["content"] for m in completion if m["role"] == "assistant"]
        return sum(0.5 for text in said if answer in text)

    rubric = vf.Rubric(funcs=[says_answer], weights=[1.0])
    return TwoTurns(dataset=dataset, rubric=rubric, max_turns=2)


async def test_a_single_turn_environment_is_scored_by_its_rubric():
    env = load_environment(ARITHMETIC)
    row = dict(env.get_dataset()[3])  # the 4th question of examples/data/arithmetic.jsonl
    engine = ScriptedEngine([f"{row['answer']} yes"])
    wrapper = ModelWrapper(engine)
    result = await WorkflowRunner(wrapper).run(_task({"example_id": 3}, {"environment": ARITHMETIC}))
    assert result.ok, result
    [exp] = result.experiences
    assert wrapper.tokenizer.decode(exp.tokens[: exp.prompt_length].tolist()) == (
        f"user: {row['question']}\nassistant: "
    )
    assert wrapper.tokenizer.decode(exp.tokens[exp.prompt_length :].tolist()) == f"{row['answer']} yes"
    assert exp.reward == 1.0 and exp.metrics["correct_answer"] == 1.0 and exp.metrics["is_number"] == 1.0
    assert exp.action_mask.all() and (exp.logprobs == -0.5).all() and not exp.truncated

    wrong = ScriptedEngine(["no"])
    [bad] = (
        await WorkflowRunner(ModelWrapper(wrong)).run(_task({"example_id": 3}, {"environment": ARITHMETIC}))
    ).experiences
    assert bad.reward == 0.0 and bad.metrics["is_number"] == 0.0


async def test_a_multi_turn_environment_is_one_sequence_with_its_messages_masked_out():
    engine = ScriptedEngine(["hi there", "hi again"])
    wrapper = ModelWrapper(engine)
    result = await WorkflowRunner(wrapper).run(_task({}, {"environment": load_two_turns}))
    assert result.ok, result
    [exp] = result.experiences
    text = wrapper.tokenizer.decode(exp.tokens.tolist())
    assert text == "user: say hi\nassistant: hi there\nuser: again\nassistant: hi again"
    response = exp.tokens[exp.prompt_length :].tolist()
    mask = exp.action_mask.tolist()
    assert "".join(chr(t) for t, m in zip(response, mask, strict=True) if m) == "hi therehi again"
    assert (
        "".join(chr(t) for t, m in zip(response, mask, strict=True) if not m) == "\nuser: again\nassistant: "
    )
    assert (exp.logprobs[~exp.action_mask] == 0).all() and (exp.logprobs[exp.action_mask] == -0.5).all()
    assert exp.reward == 1.0 and exp.metrics["turns"] == 2 and exp.metrics["num_turns"] == 2


async def test_the_tiny_model_plays_a_group(hf_engine):
    task = _task(
        {"example_id": 1}, {"environment": ARITHMETIC}, repeat_times=2, sampling=sampling(max_tokens=4)
    )
    result = await WorkflowRunner(ModelWrapper(hf_engine)).run(task)
    assert result.ok and len(result.runs) == 2
    for exp in result.experiences:
        assert exp.action_mask.all() and exp.logprobs.shape == (exp.response_length,)
        assert 0 < exp.response_length <= 4 and exp.reward in (0.0, 1.0) and (exp.logprobs <= 0).all()


async def test_names_and_what_is_missing(monkeypatch):
    assert WORKFLOWS.get("verifiers").can_repeat is False
    result = await WorkflowRunner(ModelWrapper(ScriptedEngine())).run(_task({}, {}))
    assert not result.ok and "workflow_args.environment" in str(result.error)
    monkeypatch.setitem(sys.modules, "verifiers.legacy", None)  # as if the package were not installed
    with pytest.raises(ImportError, match=r"install the\s+`verifiers` extra"):
        load_environment("not_cached:load_environment")
