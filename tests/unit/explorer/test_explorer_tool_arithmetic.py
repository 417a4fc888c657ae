"""`tool_arithmetic` and tools in `multi_turn`: a scripted engine calls the calculator then answers;
the tool response reaches the second prompt, only the model's tokens are in the action mask, and the
reward and tool metrics follow the module's rules."""

from __future__ import annotations

import pytest
import torch

from services.common.config import FormatConfig
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.tasks import Task
from services.explorer.workflows.tool_arithmetic import (
    CALCULATOR_SPEC,
    CalculatorEnv,
    calculate,
    final_integer,
)

from .fakes import ScriptedEngine, sampling

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"}}\n</tool_call>'
FORMAT = FormatConfig(prompt_key="question", response_key="answer")


def _task(raw, workflow="tool_arithmetic", **kw) -> Task:
    kw.setdefault("sampling", sampling(max_tokens=100))
    return Task(task_id="t/0", index=0, taskset="t", raw=raw, workflow=workflow, format=FORMAT, **kw)


async def _run(replies, raw=None, **kw):
    engine = ScriptedEngine(replies)
    result = await WorkflowRunner(ModelWrapper(engine)).run(
        _task(raw or {"question": "3+4=", "answer": "7"}, **kw)
    )
    assert result.ok, result
    return engine, result.experiences[0]


def _split(exp) -> tuple[str, str]:
    response, mask = exp.tokens[exp.prompt_length :].tolist(), exp.action_mask.tolist()
    said = "".join(chr(t) for t, m in zip(response, mask, strict=True) if m)
    shown = "".join(chr(t) for t, m in zip(response, mask, strict=True) if not m)
    return said, shown


async def test_a_call_then_an_answer():
    engine, e = await _run([CALL, "7"])
    assert len(engine.calls) == 2
    first = "".join(map(chr, engine.calls[0][0]))
    assert '"name": "calculator"' in first and first.endswith(
        "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    )
    second = "".join(map(chr, engine.calls[1][0]))
    tool_turn = "<|im_end|>\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert second == first + CALL + tool_turn
    said, shown = _split(e)
    assert said == CALL + "7" and shown == tool_turn
    assert torch.equal(e.logprobs[e.action_mask], torch.full((len(said),), -0.5))
    assert (e.logprobs[~e.action_mask] == 0).all()
    assert e.reward == 1.0 and e.metrics["accuracy"] == 1.0 and not e.truncated
    assert (
        e.metrics["tool_calls"] == 1.0 and e.metrics["tool_parse_errors"] == 0.0 and e.metrics["turns"] == 2.0
    )


async def test_a_wrong_answer_after_a_good_call_gets_the_format_score():
    _, e = await _run([CALL, "8"])
    assert e.reward == pytest.approx(0.1) and e.metrics["accuracy"] == 0.0
    _, e = await _run([CALL, "8"], reward_fn_args={"format_score": 0.0})
    assert e.reward == 0.0


async def test_an_answer_without_a_call_and_a_malformed_call():
    _, e = await _run(["7"])
    assert e.reward == 1.0 and e.metrics["tool_calls"] == 0.0 and e.metrics["turns"] == 1.0
    _, e = await _run(['<tool_call>{"name": calc</tool_call> 5'])
    assert e.reward == 0.0 and e.metrics["tool_parse_errors"] == 1.0 and e.metrics["tool_calls"] == 0.0


async def test_calls_until_the_turn_limit_are_truncated_unrewarded():
    _, e = await _run([CALL], workflow_args={"max_turns": 2, "max_response_tokens": 400})
    assert e.truncated and e.reward == 0.0 and e.metrics["tool_calls"] == 2.0
    said, _ = _split(e)
    assert said == CALL + CALL


async def test_multi_turn_renders_the_rows_tools_and_parses_with_the_named_parser():
    seen: list[str] = []

    class Echo:
        def reset(self, task):
            return "go"

        def call_tool(self, call):
            seen.append(call.name)
            return "ok"

        def step(self, action):
            return "", 1.0, True

    spec = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    engine = ScriptedEngine(['<tool_call>{"name": "lookup", "arguments": {}}</tool_call>', "done"])
    model = ModelWrapper(engine, tool_call_parser="qwen")
    task = Task(
        task_id="t/0",
        index=0,
        taskset="t",
        raw={"question": "q", "my_tools": [spec]},
        workflow="multi_turn",
        format=FormatConfig(prompt_key="question", tools_key="my_tools"),
        sampling=sampling(max_tokens=80),
        workflow_args={"env": Echo},
    )
    result = await WorkflowRunner(model).run(task)
    assert result.ok and seen == ["lookup"] and result.experiences[0].reward == 1.0
    assert '"name": "lookup"' in "".join(map(chr, engine.calls[0][0]))
    bad = ModelWrapper(ScriptedEngine(["x"]), tool_call_parser="nope")
    result = await WorkflowRunner(bad, max_retry_times=0).run(task)
    assert not result.ok and "unknown tool call parser 'nope'" in str(result.error)


def test_calculator_is_safe_and_the_env_scores():
    assert calculate("3+4") == 7 and calculate("12*(7+3)-5") == 115 and calculate("-2*3") == -6
    for bad in ("__import__('os')", "2**100", "1/2", "a+1", "3.5+1", "[1]"):
        with pytest.raises(ValueError):
            calculate(bad)
    assert final_integer(f"{CALL} so 12") == 12 and final_integer(CALL) is None
    env = CalculatorEnv()
    assert env.tools == [CALCULATOR_SPEC]
    from services.explorer.tools import ToolCall

    assert env.call_tool(ToolCall("c", "calculator", '{"expression": "2**9"}')).startswith("error: only")
    assert env.call_tool(ToolCall("c", "python", "{}")).startswith("error: unknown tool")
    assert env.good_calls == 0
