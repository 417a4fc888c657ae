"""ReMax's baseline on the explorer side: a task with `greedy_baseline` runs its workflow once more at
temperature 0 and every sample carries that greedy run's reward; the config turns it on for training
tasks only."""

from __future__ import annotations

from services.common.config import FormatConfig, RFTConfig, TasksetConfig, resolve
from services.explorer.engines.base import per_prompt_params
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.scheduler import TaskFactory
from services.explorer.tasks import Task

from .fakes import ScriptedEngine, sampling


class GreedyRightEngine(ScriptedEngine):
    """Samples answer wrongly; the greedy (temperature 0) reply is right."""

    async def generate(self, prompts, params):
        greedy = all(p.temperature == 0 for p in per_prompt_params(prompts, params))
        self._replies = iter(["#### 7"] if greedy else ["#### 8", "#### 7", "#### 9"])
        return await super().generate(prompts, params)


def _task(**kw) -> Task:
    return Task(
        task_id="t/0",
        index=0,
        taskset="t",
        raw={"question": "3+4?", "answer": "7"},
        workflow="math",
        format=FormatConfig(prompt_key="question", response_key="answer"),
        reward_fn="gsm8k",
        sampling=sampling(max_tokens=10, temperature=1.0),
        repeat_times=3,
        **kw,
    )


async def test_greedy_run_sets_every_samples_reward_baseline():
    engine = GreedyRightEngine()
    result = await WorkflowRunner(ModelWrapper(engine)).run(_task(greedy_baseline=True))
    assert result.ok and len(result.runs) == 1  # the greedy run is not trained on
    exps = result.runs[0]
    assert [e.reward for e in exps] == [0.0, 1.0, 0.0]
    assert [e.reward_baseline for e in exps] == [1.0, 1.0, 1.0]
    assert all(e.metrics["reward_baseline"] == 1.0 for e in exps)
    temps = sorted(p.temperature for _, p in engine.calls)
    assert temps == [0.0, 1.0] and sorted(p.n for _, p in engine.calls) == [1, 3]


async def test_without_the_flag_no_greedy_run():
    engine = GreedyRightEngine()
    result = await WorkflowRunner(ModelWrapper(engine)).run(_task())
    assert result.ok and all(e.reward_baseline is None for e in result.experiences)
    assert len(engine.calls) == 1


def test_remax_config_turns_it_on_for_training_tasks_only(tmp_path):
    def factory(algorithm, is_eval=False):
        tree = {"model": {"model_path": str(tmp_path), "max_response_tokens": 8}, "algorithm": algorithm}
        resolved = resolve(RFTConfig.model_validate(tree))
        cfg = TasksetConfig(name="t", path=str(tmp_path))
        return TaskFactory(resolved, cfg, "t", is_eval=is_eval, needs_response=lambda _: True)

    assert factory({"algorithm_type": "remax"}).greedy_baseline
    assert factory({"algorithm_type": "grpo", "advantage_fn": "remax"}).greedy_baseline
    assert not factory({"algorithm_type": "remax"}, is_eval=True).greedy_baseline
    assert not factory({"algorithm_type": "grpo"}).greedy_baseline
