"""`math`: single-turn chat on the task's prompt, `repeat_times` samples in one engine call, each scored
by a reward function from the shared rewards library (`math` via math-verify, `gsm8k`, `countdown`,
`format`, or a plug-in `pkg.mod:fn`), or by the row's `data_source` (veRL's `default_compute_score`).
With `format.prompt_type: plaintext` the prompt is the row's text as is (no chat template).

`workflow_args.judge: true` scores with an auxiliary model instead (an LLM judge over an
OpenAI-compatible API): it is asked for a score in [0, 1] and the first number of its reply is used.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from services.common import tracing
from services.common.experience import Experience
from services.common.rewards import default_compute_score, get_scorer
from services.explorer.tasks import Task
from services.explorer.workflows.base import WORKFLOWS, WorkflowBase

JUDGE_PROMPT = (
    "Question: {question}\nReference answer: {reference}\nCandidate answer: {answer}\n"
    "Reply with one number between 0 and 1: how correct is the candidate answer?"
)


def score_response(task: Task, response: str) -> tuple[float, dict[str, float]]:
    """(reward, extra numeric metrics) of one response under the task's reward function."""
    with tracing.child_span("explorer.reward"):
        return _score(task, response)


def _score(task: Task, response: str) -> tuple[float, dict[str, float]]:
    raw = task.raw
    extra_info = raw.get("extra_info") if isinstance(raw.get("extra_info"), Mapping) else None
    if task.reward_fn:
        result = get_scorer(task.reward_fn)(response, task.ground_truth, extra_info, **task.reward_fn_args)
    elif raw.get("data_source"):
        result = default_compute_score(str(raw["data_source"]), response, task.ground_truth, extra_info)
    else:
        result = get_scorer("math")(response, task.ground_truth, extra_info, **task.reward_fn_args)
    if isinstance(result, Mapping):
        extra = {k: float(v) for k, v in result.items() if k != "score" and isinstance(v, int | float)}
        return float(result["score"]), extra
    return float(result), {}


def finish(
    exp: Experience, reward: float, extra: Mapping[str, float], correct_threshold: float
) -> Experience:
    exp.reward = reward
    exp.metrics.update(extra)
    exp.metrics["reward"] = reward
    exp.metrics["accuracy"] = float(reward >= correct_threshold)
    return exp


@WORKFLOWS.register("math", "simple", "math_boxed")
class MathWorkflow(WorkflowBase):
    is_async = True
    can_repeat = True

    async def run_async(self) -> list[Experience]:
        sampling, n = self.task.sampling, self.repeat_times
        if self.task.format.prompt_type == "plaintext":
            exps = await self.model.generate_async([self.task.prompt_text()], sampling, n=n)
        else:
            exps = await self.model.chat_async(self.task.messages(), sampling, n=n)
        threshold = float(self.args.get("correct_threshold", 1.0))
        for exp in exps:
            if self.args.get("judge"):
                reward, extra = await self._judge(exp.response_text), {}
            else:
                reward, extra = score_response(self.task, exp.response_text)
            finish(exp, reward, extra, threshold)
        return exps

    async def _judge(self, answer: str) -> float:
        index = int(self.args.get("judge_model", 0))
        if index >= len(self.auxiliary_models):
            raise RuntimeError(f"workflow_args.judge needs explorer.auxiliary_models[{index}]")
        judge = self.auxiliary_models[index]
        prompt = str(self.args.get("judge_prompt", JUDGE_PROMPT)).format(
            question=self.task.prompt_text(), reference=self.task.ground_truth, answer=answer
        )
        reply = await judge.chat_async([{"role": "user", "content": prompt}], temperature=0.0)
        found = re.search(r"-?\d+(?:\.\d+)?", reply)
        return min(max(float(found.group()), 0.0), 1.0) if found else 0.0
