"""`openenv`: multi-turn episodes against an OpenEnv environment server (Meta / Hugging Face OpenEnv).

An OpenEnv environment is a FastAPI server (`openenv.core.env_server.create_app`) that keeps one
environment per WebSocket session and answers `reset` and `step(action)` with
`{"observation": {...}, "reward": float | None, "done": bool}`. `OpenEnvEnvironment` is the
`multi_turn` environment (multi_turn.py: the turns, the masks, the rewards) that plays one episode
through the library's own client, `openenv.core.GenericEnvClient` (WebSocket `/ws`; its calls are
blocking, so they run in a worker thread):
- the episode opens a session and sends `reset` (arguments `reset_args`, and the row's `seed` when it
  has one, so the samples of a GRPO group play the same episode);
- each model turn is sent as the action `{action_key: text}` (the environment's Action model names the
  field; `action_args` adds fixed fields);
- the observation shown to the model is its `observation_key` field, or, without one, the fields of
  the observation as `key: value` lines; the reward of each step is the server's (None counts 0),
  `done` ends the episode, and the session is closed at the end.

`workflow_type: openenv` is `multi_turn` over this environment with its arguments in `workflow_args`
(`base_url`, `action_key`, `observation_key`, `reset_args`, `action_args`, `timeout_s`) next to
`max_turns`. The library is the optional extra `rft-mesh[openenv]` (the package `openenv-core`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from services.common.extras import import_extra
from services.explorer.tasks import Task
from services.explorer.workflows.base import WORKFLOWS
from services.explorer.workflows.multi_turn import ENVIRONMENTS, MultiTurnWorkflow

MISSING = (
    "the openenv environment needs the OpenEnv client, which is not installed here: install the "
    "`openenv` extra (`uv pip install -e '.[openenv]' -c requirements/constraints.txt`, the package "
    "`openenv-core`)"
)


def observation_text(observation: Any, key: str | None = None) -> str:
    """What the model reads of an OpenEnv observation: its `key` field, or every field as a line."""
    if not isinstance(observation, Mapping):
        return str(observation)
    if key is not None:
        if key not in observation:
            raise KeyError(
                f"the OpenEnv observation has no field {key!r} (observation_key); its fields: "
                f"{sorted(observation)}"
            )
        return str(observation[key])
    lines = []
    for name, value in observation.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        lines.append(f"{name}: {text}")
    return "\n".join(lines)


@ENVIRONMENTS.register("openenv")
class OpenEnvEnvironment:
    """One episode on an OpenEnv server (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        action_key: str = "message",
        observation_key: str | None = None,
        reset_args: Mapping[str, Any] | None = None,
        action_args: Mapping[str, Any] | None = None,
        timeout_s: float = 60.0,
    ):
        self.client = import_extra("openenv.core", MISSING).GenericEnvClient(
            base_url=base_url,
            connect_timeout_s=min(10.0, float(timeout_s)),
            message_timeout_s=float(timeout_s),
        )
        self.action_key, self.observation_key = action_key, observation_key
        self.reset_args = dict(reset_args or {})
        self.action_args = dict(action_args or {})
        self.last_observation: Any = None

    async def reset(self, task: Task) -> str:
        kwargs = dict(self.reset_args)
        if "seed" in task.raw and "seed" not in kwargs:
            kwargs["seed"] = task.raw["seed"]
        result = await asyncio.to_thread(self.client.reset, **kwargs)
        self.last_observation = result.observation
        return observation_text(result.observation, self.observation_key)

    async def step(self, action: str) -> tuple[str, float, bool, dict[str, str]]:
        payload = {**self.action_args, self.action_key: action}
        result = await asyncio.to_thread(self.client.step, payload)
        self.last_observation = result.observation
        text = observation_text(result.observation, self.observation_key)
        return text, float(result.reward or 0.0), bool(result.done), {}

    async def close(self) -> None:
        await asyncio.to_thread(self.client.disconnect)


@WORKFLOWS.register("openenv")
class OpenEnvWorkflow(MultiTurnWorkflow):
    """`multi_turn` over an OpenEnv server, its arguments in `workflow_args`."""

    default_env = "openenv"
    env_arg_names = ("base_url", "action_key", "observation_key", "reset_args", "action_args", "timeout_s")
