"""Turns taskset rows into Tasks: which workflow, reward function, sampling params and repeat count each
row gets, drawing training batches round-robin across `buffer.explorer_input.tasksets`.

The workflow and reward function a taskset names are resolved when it opens (plug-ins imported), so
a misspelt name or a plug-in that does not import stops the explorer at start, not at its first step.

Several explorers can share tasksets without overlap: explorer `i` of `n` (its shard) takes the rows
whose index is `i` modulo `n`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from services.common.config import Resolved, TasksetConfig
from services.common.rewards import get_scorer
from services.explorer.tasks import Task
from services.explorer.tasksets import Taskset
from services.explorer.workflows import workflow_class

DEFAULT_WORKFLOW = "math"


class TaskFactory:
    """Builds a Task for a row of a taskset from the config's defaults (taskset > explorer_input > built-in)."""

    def __init__(
        self,
        resolved: Resolved,
        cfg: TasksetConfig,
        name: str,
        *,
        is_eval: bool,
        needs_response: Callable[[str], bool],
    ):
        ei = resolved.config.buffer.explorer_input
        default = ei.default_eval_workflow_type if is_eval else None
        self.cfg = cfg
        self.name = name
        self.is_eval = is_eval
        self.workflow = cfg.default_workflow_type or default or ei.default_workflow_type or DEFAULT_WORKFLOW
        self.reward_fn = cfg.default_reward_fn_type or ei.default_reward_fn_type
        self.sampling = resolved.sampling_params(cfg)
        self.repeat_times = resolved.repeat_times(cfg, eval=is_eval)
        self.greedy_baseline = not is_eval and resolved.config.algorithm.greedy_baseline
        self._needs_response = needs_response
        # the configured names resolve now (plug-ins imported): a bad one stops the explorer at start
        _resolve(f"taskset {name!r}: workflow", self.workflow, workflow_class)
        if self.reward_fn:
            _resolve(f"taskset {name!r}: reward function", self.reward_fn, get_scorer)

    def workflow_of(self, row: Mapping[str, Any]) -> str:
        key = self.cfg.format.workflow_key
        return str(row[key]) if key and row.get(key) else self.workflow

    def needs_response(self, row: Mapping[str, Any]) -> bool:
        return self._needs_response(self.workflow_of(row))

    def task(self, index: int, row: Mapping[str, Any], epoch: int) -> Task:
        key = self.cfg.format.reward_fn_key
        return Task(
            task_id=f"{self.name}/{index}",
            index=index,
            taskset=self.name,
            raw=row,
            workflow=self.workflow_of(row),
            repeat_times=self.repeat_times,
            format=self.cfg.format,
            sampling=self.sampling,
            workflow_args=self.cfg.workflow_args,
            reward_fn=str(row[key]) if key and row.get(key) else self.reward_fn,
            reward_fn_args=self.cfg.reward_fn_args,
            is_eval=self.is_eval,
            epoch=epoch,
            greedy_baseline=self.greedy_baseline,
        )


def _resolve(what: str, name: str, lookup: Callable[[str], Any]) -> None:
    """`lookup(name)`, its error re-raised (same type) with `what` in front."""
    try:
        lookup(name)
    except (ImportError, KeyError, TypeError) as exc:
        raise type(exc)(f"{what} {name!r}: {exc}") from exc


def taskset_name(cfg: TasksetConfig, i: int, prefix: str = "taskset") -> str:
    return cfg.name or f"{prefix}{i}"


def open_tasksets(
    resolved: Resolved,
    configs: list[TasksetConfig],
    *,
    is_eval: bool,
    needs_response: Callable[[str], bool],
    shard: tuple[int, int] = (0, 1),
) -> list[tuple[Taskset, TaskFactory]]:
    epochs = 1 if is_eval else resolved.config.buffer.total_epochs
    ei = resolved.config.buffer.explorer_input
    out = []
    for i, cfg in enumerate(configs):
        name = taskset_name(cfg, i, "eval" if is_eval else "taskset")
        if is_eval:
            where = f"buffer.explorer_input.eval_tasksets[{i}]"
        else:
            where = "buffer.explorer_input." + ("taskset" if ei.taskset is not None else f"tasksets[{i}]")
        factory = TaskFactory(resolved, cfg, name, is_eval=is_eval, needs_response=needs_response)
        taskset = Taskset(
            cfg,
            name=name,
            total_epochs=epochs,
            needs_response=factory.needs_response,
            shard=shard,
            where=where,
        )
        out.append((taskset, factory))
    return out


class TaskScheduler:
    """Training batches: `batch_size` tasks per explore step, round-robin over the tasksets."""

    def __init__(self, tasksets: list[tuple[Taskset, TaskFactory]]):
        self.tasksets = tasksets
        self._next = 0

    @property
    def exhausted(self) -> bool:
        return all(ts.exhausted for ts, _ in self.tasksets)

    @property
    def bad_rows(self) -> int:
        return sum(ts.bad_rows for ts, _ in self.tasksets)

    def next_batch(self, size: int) -> list[Task]:
        """Up to `size` tasks; fewer only at the very end of the data, empty when exhausted."""
        batch: list[Task] = []
        while len(batch) < size and not self.exhausted:
            ts, factory = self.tasksets[self._next % len(self.tasksets)]
            self._next += 1
            got = ts.next_row()
            if got is not None:
                batch.append(factory.task(*got))
        return batch

    def state(self) -> dict[str, Any]:
        return {"next": self._next, "tasksets": {ts.name: ts.state() for ts, _ in self.tasksets}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self._next = int(state.get("next", 0))
        saved = state.get("tasksets", {})
        for ts, _ in self.tasksets:
            if ts.name in saved:
                ts.load_state(saved[ts.name])


def all_tasks(taskset: Taskset, factory: TaskFactory) -> list[Task]:
    """Every good row of one pass (evaluation)."""
    taskset.position.epoch = taskset.position.offset = 0
    tasks = []
    while (got := taskset.next_row()) is not None:
        tasks.append(factory.task(*got))
    return tasks
