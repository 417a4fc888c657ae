"""Workflows by name: `math` (alias `simple`, `math_boxed`), `arithmetic` (the quickstart), `multi_turn`
(over an environment, with tools), `tool_arithmetic` (a calculator tool), `openenv` (an OpenEnv server),
`textarena` (TextArena games), `verifiers` (a verifiers environment), or a dotted-path plug-in.
See `base.py` for the interface; `multi_turn.py` for the environment interface the adapters share."""

from services.explorer.workflows import (  # noqa: F401 - register
    arithmetic,
    math,
    multi_turn,
    openenv_env,
    text_games,
    tool_arithmetic,
    verifiers_env,
)
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
