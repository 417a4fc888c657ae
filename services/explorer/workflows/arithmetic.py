"""`arithmetic`: the quickstart workflow. The prompt is the row's plain text (e.g. `"12+7="`, no chat
template, so a tiny model can learn it), the response's leading integer is compared with the answer.

Reward (`reward_fn_args` may change the numbers): `correct_score` (1.0) for the right number,
`format_score` (0.1) for a wrong number, 0 when the response does not start with a number.
`make_arithmetic_rows` writes such tasks for tests and examples.
"""

from __future__ import annotations

import random
import re
from typing import Any

from services.common import tracing
from services.common.experience import Experience
from services.explorer.workflows.base import WORKFLOWS, WorkflowBase
from services.explorer.workflows.math import finish

_LEADING_INT = re.compile(r"\s*(-?\d+)")


def arithmetic_reward(
    response: str, answer: Any, correct_score: float = 1.0, format_score: float = 0.1
) -> float:
    found = _LEADING_INT.match(response)
    if not found:
        return 0.0
    try:
        return correct_score if int(found.group(1)) == int(str(answer).strip()) else format_score
    except ValueError:
        return format_score


def make_arithmetic_rows(
    count: int, seed: int = 0, max_operand: int = 9, ops: str = "+"
) -> list[dict[str, str]]:
    """Rows like {"question": "3+4=", "answer": "7"}."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        rows.append({"question": f"{a}{op}{b}=", "answer": str(value)})
    return rows


@WORKFLOWS.register("arithmetic")
class ArithmeticWorkflow(WorkflowBase):
    is_async = True
    can_repeat = True

    async def run_async(self) -> list[Experience]:
        sampling, n = self.task.sampling, self.repeat_times
        if self.args.get("use_chat_template"):
            exps = await self.model.chat_async(self.task.messages(), sampling, n=n)
        else:
            exps = await self.model.generate_async([self.task.prompt_text()], sampling, n=n)
        options = {
            k: float(v) for k, v in self.task.reward_fn_args.items() if k in ("correct_score", "format_score")
        }
        with tracing.child_span("explorer.reward"):
            for exp in exps:
                reward = arithmetic_reward(exp.response_text, self.task.ground_truth, **options)
                finish(exp, reward, {}, options.get("correct_score", 1.0))
        return exps
