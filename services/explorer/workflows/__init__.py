"""Workflows by name: `math` (alias `simple`, `math_boxed`), `arithmetic` (the quickstart), `multi_turn`
(over an environment, with tools), `tool_arithmetic` (a calculator tool), or a dotted-path plug-in.
See `base.py` for the interface."""

from services.explorer.workflows import arithmetic, math, multi_turn, tool_arithmetic  # noqa: F401 - register
from services.explorer.workflows.base import (
    WORKFLOWS,
    Workflow,
    WorkflowBase,
    requires_ground_truth,
    workflow_class,
)
from services.explorer.workflows.multi_turn import ENVIRONMENTS, Environment

__all__ = [
    "ENVIRONMENTS",
    "WORKFLOWS",
    "Environment",
    "Workflow",
    "WorkflowBase",
    "requires_ground_truth",
    "workflow_class",
]
