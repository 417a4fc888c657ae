"""Runs one task's workflow with a per-task timeout and `max_retry_times` retries.

A workflow that raises or outlives `explorer.max_timeout` is built afresh and run again (not after an
ImportError, e.g. a plug-in named by a row that does not import: that would only repeat); after the
last retry the task is recorded as failed (its partial group is dropped, so groups stay whole) and the
explorer goes on. A task with `greedy_baseline` (ReMax, https://arxiv.org/abs/2310.10505) runs its
workflow once more at temperature 0; the mean reward of that greedy run becomes every sample's
`reward_baseline` (the advantage is r - r_greedy) and is not itself trained on. Async workflows are cancelled on timeout. Sync workflows run in daemon threads: a
hung one cannot be killed, but it is abandoned and never blocks the explorer or its shutdown.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.common import tracing
from services.common.experience import Experience
from services.common.log import get_logger
from services.explorer.model_wrapper import ModelWrapper, PromptTooLong
from services.explorer.tasks import Task
from services.explorer.workflows import workflow_class

log = get_logger("explorer.runner")


@dataclass
class TaskResult:
    """Outcome of one task: `runs[i]` are the experiences of run i (one run holds the whole group when
    the workflow `can_repeat`)."""

    task: Task
    runs: list[list[Experience]] = field(default_factory=list)
    ok: bool = True
    attempts: int = 0
    error: str = ""
    retries: int = 0
    seconds: float = 0.0

    @property
    def experiences(self) -> list[Experience]:
        return [e for run in self.runs for e in run]


def in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run `fn` in a daemon thread, in a copy of the caller's context (the trace span goes along); the
    returned future resolves on the current loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def target() -> None:
        try:
            result, ok = context.run(fn), True
        except BaseException as exc:  # delivered to the awaiting task, which decides
            result, ok = exc, False
        if not loop.is_closed():
            loop.call_soon_threadsafe(deliver, ok, result)

    threading.Thread(target=target, name="workflow", daemon=True).start()
    return future


def greedy_task(task: Task) -> Task:
    """The same task run once at temperature 0 (greedy decoding), for ReMax's baseline."""
    if task.sampling is None:
        raise ValueError(f"task {task.task_id}: the greedy baseline needs the task's sampling params")
    greedy = task.sampling.replace(temperature=0.0)
    return dataclasses.replace(task, repeat_times=1, sampling=greedy, greedy_baseline=False)


def set_reward_baseline(runs: Sequence[Sequence[Experience]], greedy: Sequence[Experience]) -> float | None:
    """Give every sample of `runs` the mean reward of the `greedy` run as `reward_baseline` (also
    logged as the `reward_baseline` metric); returns it, or None when the greedy run has no reward."""
    rewards = [e.reward for e in greedy if e.reward is not None]
    if not rewards:
        return None
    baseline = statistics.fmean(rewards)
    for run in runs:
        for exp in run:
            exp.reward_baseline = baseline
            exp.metrics["reward_baseline"] = baseline
    return baseline


class WorkflowRunner:
    def __init__(
        self,
        model: ModelWrapper,
        *,
        auxiliary_models: Sequence[Any] = (),
        timeout_s: float = 1800.0,
        max_retry_times: int = 2,
    ):
        self.model = model
        self.auxiliary_models = list(auxiliary_models)
        self.timeout_s = timeout_s
        self.max_retry_times = max_retry_times

    async def run(self, task: Task) -> TaskResult:
        t0 = time.perf_counter()
        result = TaskResult(task=task)
        try:
            cls = workflow_class(task.workflow)
        except Exception as exc:  # unknown workflow (a row's workflow_key): not worth retrying
            result.ok, result.error = False, f"{type(exc).__name__}: {exc}"
            log.error("workflow not found", task=task.task_id, workflow=task.workflow, error=result.error)
            return result
        runs = 1 if getattr(cls, "can_repeat", False) else task.repeat_times
        todo = [task] * runs + ([greedy_task(task)] if task.greedy_baseline else [])
        outcomes = await asyncio.gather(*(self._attempts(cls, t) for t in todo))
        result.attempts = sum(a for _, a, _ in outcomes)
        result.retries = sum(a - 1 for _, a, _ in outcomes)
        errors = [e for exps, _, e in outcomes if exps is None]
        if errors:
            result.ok, result.error = False, errors[0]
        else:
            result.runs = [exps for exps, _, _ in outcomes]  # type: ignore[misc]
            if task.greedy_baseline and set_reward_baseline(result.runs[:-1], result.runs.pop()) is None:
                result.ok, result.runs = False, []
                result.error = "the greedy (ReMax baseline) run returned no rewarded experience"
        result.seconds = time.perf_counter() - t0
        return result

    async def _attempts(self, cls: type, task: Task) -> tuple[list[Experience] | None, int, str]:
        error = ""
        for attempt in range(1, self.max_retry_times + 2):
            try:
                exps = await asyncio.wait_for(self._once(cls, task), timeout=self.timeout_s)
                return exps, attempt, ""
            except TimeoutError:
                error = f"timed out after {self.timeout_s:g}s"
            except PromptTooLong as exc:
                return None, attempt, str(exc)
            except ImportError as exc:  # a plug-in (a row's reward function, say) that does not import
                error = f"{type(exc).__name__}: {exc}"
                log.error("workflow failed", task=task.task_id, workflow=task.workflow, error=error)
                return None, attempt, error
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "workflow failed", task=task.task_id, workflow=task.workflow, attempt=attempt, error=error
            )
        return None, self.max_retry_times + 1, error

    async def _once(self, cls: type, task: Task) -> list[Experience]:
        workflow = cls(task=task, model=self.model, auxiliary_models=self.auxiliary_models)
        if getattr(cls, "can_repeat", False) and hasattr(workflow, "set_repeat_times"):
            workflow.set_repeat_times(task.repeat_times)
        with tracing.child_span("explorer.task", {"rft.task_id": str(task.task_id)}):
            if getattr(cls, "is_async", False):
                exps = await workflow.run_async()
            else:
                exps = await in_daemon_thread(workflow.run)
        exps = list(exps or [])
        if not exps or not all(isinstance(e, Experience) for e in exps):
            raise TypeError(f"workflow {task.workflow!r} returned {len(exps)} items; expected Experiences")
        return exps
