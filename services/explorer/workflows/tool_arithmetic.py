"""`tool_arithmetic`: answer an arithmetic question, with a `calculator` tool the model may call.

A `multi_turn` episode (multi_turn.py does the turns, the tool-call parsing and the masking) over the
`calculator` environment: the first prompt is the row's question (`format.prompt_key`, e.g. "3+4=")
with the calculator's spec in the prompt (or the row's own `format.tools_key` specs); a reply with
a `<tool_call>` (parser `explorer.rollout_model.tool_call_parser`, default hermes) gets the result as a
`<tool_response>` and the model speaks again; the first reply without a tool call is the answer and
ends the episode. At most `workflow_args.max_turns` (3) model turns.

Reward (`reward_fn_args` may change the numbers; the top reward is `correct_score`):
- `correct_score` (1.0) when the answer's last integer equals the row's answer (`format.response_key`);
- else `format_score` (0.1) when the episode made at least one well-formed calculator call (a call
  named `calculator` whose `expression` evaluates), a small signal that helps a model learn to call;
- else 0.
Only the model's tokens are trained on: tool responses and template text are masked out.

Writing another tool workflow: an environment with `reset(task)`, `step(answer) -> (obs, reward,
done)`, `call_tool(call: ToolCall) -> str` and a `tools` list of OpenAI specs, registered in
`ENVIRONMENTS`; then `workflow_type: multi_turn` with `workflow_args.env` naming it.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any

from services.explorer.tasks import BadRow, Task
from services.explorer.tools import ToolCall
from services.explorer.workflows.base import WORKFLOWS
from services.explorer.workflows.multi_turn import ENVIRONMENTS, MultiTurnWorkflow

CALCULATOR_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an integer expression with + - * and parentheses, e.g. 12*7+3.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_MAX_ABS = 10**18  # results beyond this are refused (no huge products)


def calculate(expression: str) -> int:
    """The value of an integer expression of + - * and parentheses; anything else is a ValueError.

    Parsed with `ast` and walked node by node: names, calls, attributes, powers and every other
    Python construct are refused, so no code runs."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an expression: {expression!r}") from exc

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = -walk(node.operand) if isinstance(node.op, ast.USub) else walk(node.operand)
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](walk(node.left), walk(node.right))
        else:
            raise ValueError(f"only integers, + - * and parentheses are allowed, not {type(node).__name__}")
        if abs(value) > _MAX_ABS:
            raise ValueError("result too large")
        return value

    return walk(tree)


_INT = re.compile(r"-?\d+")
_TOOL_BLOCK = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


def final_integer(text: str) -> int | None:
    """The last integer of a reply outside tool-call blocks, or None."""
    found = _INT.findall(_TOOL_BLOCK.sub(" ", text))
    return int(found[-1]) if found else None


@ENVIRONMENTS.register("calculator")
class CalculatorEnv:
    """An arithmetic question, a calculator tool, one final answer (see the module docstring)."""

    tools = [CALCULATOR_SPEC]

    def __init__(self, correct_score: float = 1.0, format_score: float = 0.1):
        self.correct_score, self.format_score = float(correct_score), float(format_score)
        self.answer: int | None = None
        self.good_calls = 0

    def reset(self, task: Task) -> str:
        truth = task.ground_truth
        try:
            self.answer = int(str(truth).strip())
        except ValueError as exc:
            raise BadRow(f"{task.format.response_key!r} must be an integer, got {truth!r}") from exc
        return task.prompt_text()

    def call_tool(self, call: ToolCall) -> str:
        if call.name != "calculator":
            return f"error: unknown tool {call.name!r}; the tool is 'calculator'"
        args = json.loads(call.arguments)
        expression = args.get("expression")
        if not isinstance(expression, str):
            return 'error: give {"expression": "<a+b>"}'
        try:
            value = calculate(expression)
        except ValueError as exc:
            return f"error: {exc}"
        self.good_calls += 1
        return str(value)

    def step(self, action: str) -> tuple[str, float, bool]:
        if final_integer(action) == self.answer:
            return "", self.correct_score, True
        return "", self.format_score if self.good_calls else 0.0, True


@WORKFLOWS.register("tool_arithmetic")
class ToolArithmeticWorkflow(MultiTurnWorkflow):
    requires_ground_truth = True
    default_env = "calculator"
    default_max_turns = 3

    def _env(self) -> CalculatorEnv:
        options = {
            k: self.task.reward_fn_args[k]
            for k in ("correct_score", "format_score")
            if k in self.task.reward_fn_args
        }
        return CalculatorEnv(**{**options, **dict(self.args.get("env_args", {}))})
