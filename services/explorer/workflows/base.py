"""The Workflow interface (Trinity-RFT's): built from a task, the rollout model and the auxiliary models;
`run()` (sync, in a worker thread) or `run_async()` (on the event loop) returns Experiences with
rewards already computed.

Class flags, as in Trinity-RFT:
- `is_async`: the runner awaits `run_async()`; else it calls `run()` in a worker thread.
- `can_repeat`: the workflow makes all `task.repeat_times` samples of its group in one run (e.g. one
  engine call with `n`); else the runner runs it `repeat_times` times.
- `requires_ground_truth`: rows without the format's `response_key` are bad rows for this workflow.

Workflows are found by name in `WORKFLOWS` or as a dotted-path plug-in (`my_pkg.flows:MyWorkflow`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from services.common.experience import Experience
from services.common.registry import Registry
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.tasks import Task


@runtime_checkable
class Workflow(Protocol):
    is_async: ClassVar[bool]
    can_repeat: ClassVar[bool]
    requires_ground_truth: ClassVar[bool]

    def __init__(
        self, *, task: Task, model: ModelWrapper, auxiliary_models: Sequence[Any] | None = None
    ) -> None: ...


WORKFLOWS: Registry[type] = Registry("workflow")


class WorkflowBase:
    """Optional convenience base: stores the constructor arguments and the group size."""

    is_async: ClassVar[bool] = True
    can_repeat: ClassVar[bool] = True
    requires_ground_truth: ClassVar[bool] = True

    def __init__(self, *, task: Task, model: ModelWrapper, auxiliary_models: Sequence[Any] | None = None):
        self.task = task
        self.model = model
        self.auxiliary_models = list(auxiliary_models or [])
        self.repeat_times = task.repeat_times if self.can_repeat else 1
        self.args = dict(task.workflow_args)

    def set_repeat_times(self, repeat_times: int) -> None:
        self.repeat_times = repeat_times

    def run(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__} is async; call run_async()")

    async def run_async(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__} is sync; call run()")


def workflow_class(name: str) -> type:
    cls = WORKFLOWS.get(name)
    if not isinstance(cls, type):
        raise TypeError(f"workflow {name!r} resolved to {cls!r}, which is not a class")
    return cls


def requires_ground_truth(name: str) -> bool:
    return bool(getattr(workflow_class(name), "requires_ground_truth", True))
