"""An example plug-in: a `count_up` workflow and its reward function, kept outside the `services`
package. Loaded by `rft run --config examples/plugins/plugin.yaml` (its `plugin_dirs: [.]`) or by
`--plugin-dir examples/plugins`: every module of the folder is imported at the start of each service.

The task: a row `{"prompt": "3 4 5", "answer": "6"}`; the model should answer the next number.

- `CountUpWorkflow` is registered under the name `count_up` (the decorator runs at import), so a
  taskset says `default_workflow_type: count_up`.
- `count_up_reward` is not registered: a taskset names it by its plug-in path,
  `default_reward_fn_type: count_up:count_up_reward` (module `count_up`, object `count_up_reward`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from services.common.experience import Experience
from services.common.rewards import get_scorer
from services.explorer.workflows import WORKFLOWS, WorkflowBase

_NUMBER = re.compile(r"\s*(-?\d+)")


def count_up_reward(
    solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None, near_score: float = 0.5
) -> dict[str, float]:
    """1 for the right next number, `near_score` for one off by one, 0 otherwise. The extra key
    `count_up_distance` (|answer - right|, 10 when there is no number) becomes a metric."""
    found = _NUMBER.match(solution_str)
    if not found:
        return {"score": 0.0, "count_up_distance": 10.0}
    distance = abs(int(found.group(1)) - int(str(ground_truth)))
    score = 1.0 if distance == 0 else near_score if distance == 1 else 0.0
    return {"score": score, "count_up_distance": float(min(distance, 10))}


@WORKFLOWS.register("count_up")
class CountUpWorkflow(WorkflowBase):
    """`repeat_times` samples of the row's prompt in one engine call, each scored by the taskset's
    reward function (`default_reward_fn_type`, with `reward_fn_args`)."""

    is_async = True  # run_async() on the explorer's event loop
    can_repeat = True  # one call makes the whole group (n = repeat_times)

    async def run_async(self) -> list[Experience]:
        prompt = self.task.prompt_text() + " "
        # the taskset's sampling params (a SamplingParams), n samples: one group
        experiences = await self.model.generate_async([prompt], self.task.sampling, n=self.repeat_times)
        score = get_scorer(self.task.reward_fn or "count_up:count_up_reward")
        for exp in experiences:
            result = score(exp.response_text, self.task.ground_truth, None, **self.task.reward_fn_args)
            exp.reward = float(result["score"])
            exp.metrics["count_up_distance"] = result["count_up_distance"]
            exp.metrics["accuracy"] = float(result["score"] == 1.0)
            exp.info["workflow"] = "count_up"
        return experiences
