"""The explorer does not swallow plug-ins that do not resolve: a taskset's configured workflow or reward
function is resolved when the tasksets open (the explorer's start), and a plug-in that fails to import
while a task runs (a row's own reward function) fails that task at once instead of being retried."""

from __future__ import annotations

import pytest

from services.common.config import FormatConfig, load_config, resolve
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.scheduler import open_tasksets
from services.explorer.tasks import Task

from .fakes import ScriptedEngine, sampling


def _open(tmp_path, **taskset: str):
    data = tmp_path / "t.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    fields = ", ".join(f"{k}: {v!r}" for k, v in taskset.items())
    text = f"""
model: {{max_response_tokens: 4}}
buffer: {{explorer_input: {{tasksets: [{{name: sums, path: {str(data)!r}, {fields}}}]}}}}
"""
    resolved = resolve(load_config(text=text))
    return open_tasksets(resolved, resolved.tasksets, is_eval=False, needs_response=lambda w: True)


def test_configured_names_resolve_when_the_tasksets_open(tmp_path):
    with pytest.raises(ImportError) as err:
        _open(tmp_path, default_reward_fn_type="explorer_no_such_rewards:score")
    assert str(err.value).startswith("taskset 'sums': reward function 'explorer_no_such_rewards:score': ")
    assert "No module named 'explorer_no_such_rewards'" in str(err.value)
    with pytest.raises(KeyError, match="taskset 'sums': workflow 'arithmetik': unknown workflow") as err:
        _open(tmp_path, default_workflow_type="arithmetik")
    assert "did you mean 'arithmetic'?" in str(err.value)
    ((taskset, factory),) = _open(
        tmp_path, default_workflow_type="arithmetic", default_reward_fn_type="gsm8k"
    )
    assert factory.workflow == "arithmetic" and factory.reward_fn == "gsm8k"


async def test_a_plugin_import_error_while_a_task_runs_is_not_retried():
    engine = ScriptedEngine(["#### 2"])
    task = Task(
        task_id="t/0", index=0, taskset="t", raw={"question": "1+1", "answer": "2"}, workflow="math",
        format=FormatConfig(prompt_key="question", response_key="answer"), sampling=sampling(max_tokens=8),
        reward_fn="explorer_row_rewards_missing:score",
    )  # fmt: skip
    result = await WorkflowRunner(ModelWrapper(engine), max_retry_times=3).run(task)
    assert not result.ok and result.attempts == 1 and result.retries == 0
    assert result.error.startswith("ImportError: cannot import module 'explorer_row_rewards_missing'")
    assert len(engine.calls) == 1  # the workflow ran once, not max_retry_times + 1 times
