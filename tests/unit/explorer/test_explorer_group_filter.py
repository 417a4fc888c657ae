"""DAPO dynamic sampling in the explorer: groups whose rewards are all equal are dropped before they
are put, more tasks are sampled until the step is full, and `max_num_gen_batches` bounds the rounds."""

from __future__ import annotations

import json

import pytest

from services.common.config import load_config
from services.common.config.algorithm import FilterGroupsConfig
from services.common.experience import Experience
from services.explorer.core import ExplorerCore
from services.explorer.group_filter import fill_step, group_has_signal, sample_metric
from services.explorer.runner import TaskResult
from services.explorer.settings import ExplorerSettings
from services.explorer.sink import ListSink
from services.explorer.tasks import Task
from services.explorer.workflows import WORKFLOWS

from .fakes import ScriptedEngine


def _result(index: int, rewards: list[float], ok: bool = True, **metrics: float) -> TaskResult:
    task = Task(task_id=f"t/{index}", index=index, taskset="t", raw={}, workflow="x")
    exps = [Experience(tokens=[1, 2, 3], prompt_length=1, reward=r, metrics=dict(metrics)) for r in rewards]
    return TaskResult(task=task, runs=[exps], ok=ok)


def test_signal_by_metric():
    assert group_has_signal(_result(0, [1.0, 0.0]), "score")
    assert not group_has_signal(_result(0, [0.5, 0.5, 0.5]), "seq_reward")
    assert not group_has_signal(_result(0, [1.0]), "score")  # one sample: std 0
    # acc reads the sample's accuracy metric before its reward
    assert not group_has_signal(_result(0, [0.1, 0.0], accuracy=0.0), "acc")
    exp = Experience(tokens=[1, 2, 3], prompt_length=1, reward=1.0, token_level_rewards=[0.25, 0.5])
    assert sample_metric(exp, "seq_final_reward") == 0.75 and sample_metric(exp, "score") == 1.0


async def test_fill_step_drops_flat_groups_and_samples_until_full():
    rounds = iter([[_result(2, [1, 1]), _result(3, [0, 1])], [_result(4, [0, 1]), _result(5, [1, 0])]])
    calls = []

    async def generate():
        calls.append(1)
        return next(rounds)

    first = [_result(0, [1, 0]), _result(1, [0, 0]), _result(9, [], ok=False)]
    out, metrics = await fill_step(first, 3, FilterGroupsConfig(enable=True, metric="score"), generate)
    assert [r.task.index for r in out] == [0, 3, 4, 9]  # three with signal (5 is extra), the failed task
    assert metrics == {
        "rollout/num_gen_batches": 3.0,
        "rollout/dropped_groups": 2.0,
        "rollout/filled_groups": 0.0,
    }
    assert len(calls) == 2


async def test_fill_step_stops_at_max_num_gen_batches_and_fills_with_flat_groups():
    async def generate():
        return [_result(7, [1, 1]), _result(8, [0, 0])]

    first = [_result(0, [1, 0]), _result(1, [0, 0])]
    cfg = FilterGroupsConfig(enable=True, metric="score", max_num_gen_batches=2)
    out, metrics = await fill_step(first, 4, cfg, generate)
    assert [r.task.index for r in out] == [0, 1, 7, 8]
    assert metrics["rollout/num_gen_batches"] == 2 and metrics["rollout/filled_groups"] == 3
    assert metrics["rollout/dropped_groups"] == 0


class _EveryThird:
    """Rewards [1, 0] for tasks whose index is a multiple of 3, [1, 1] (no signal) for the others."""

    is_async = True
    can_repeat = True
    requires_ground_truth = False

    def __init__(self, *, task, model, auxiliary_models=None):
        self.task, self.model = task, model

    def set_repeat_times(self, n):
        self.n = n

    async def run_async(self):
        exps = await self.model.generate_async([self.task.prompt_text()], n=self.n)
        for j, e in enumerate(exps):
            e.reward = float(j == 0) if self.task.index % 3 == 0 else 1.0
        return exps


WORKFLOWS.add("test_filter_every_third", _EveryThird)


@pytest.mark.parametrize(("limit", "steps"), [(0, [[0, 3], [6, 9]]), (2, [[0, 3], [6, 4]])])
async def test_explorer_puts_only_groups_that_differ(tmp_path, limit, steps):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}?", "answer": "0"}) + "\n" for i in range(12)))
    config = load_config(
        text=f"""
checkpoint_root_dir: {tmp_path}/ckpt
algorithm: {{algorithm_type: grpo, repeat_times: 2,
            filter_groups: {{enable: true, metric: seq_reward, max_num_gen_batches: {limit}}}}}
model: {{max_response_tokens: 4}}
buffer:
  batch_size: 2
  total_steps: 2
  explorer_input:
    taskset: {{name: t, path: {data}, default_workflow_type: test_filter_every_third,
               format: {{prompt_key: question, response_key: answer}}}}
explorer: {{eval_on_startup: false}}
"""
    )
    core = ExplorerCore(
        ExplorerSettings.from_config(config),
        engines=[ScriptedEngine(["7"])],
        sink=ListSink(),
        explorer_id="ex",
    )
    await core.start()
    results = await core.explore()
    put = [e.eid.task_id for e in core.sink.experiences]
    assert put == [f"t/{i}" for step in steps for i in step for _ in range(2)]  # full steps of whole groups
    assert [r.experiences for r in results] == [4, 4]
    second = results[1].metrics
    if limit:
        assert second["rollout/num_gen_batches"] == 2 and second["rollout/filled_groups"] == 1
        assert second["rollout/dropped_groups"] == 2  # tasks 5 and 7 (4 filled the step)
    else:
        assert second["rollout/num_gen_batches"] == 3 and second["rollout/dropped_groups"] == 4
    assert results[0].metrics["rollout/dropped_groups"] == 2
