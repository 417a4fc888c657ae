"""Play a multi-turn environment through serve mode's OpenAI endpoint: one episode, one session.

The environments of `ENVIRONMENTS` (multi_turn.py's interface: `reset(task)`, `step(action)` ->
`(observation, reward, done[, info])`, optional `close()`; the OpenEnv and TextArena adapters
included) are written for the `multi_turn` workflow, where the explorer samples each turn. An
application that drives the policy through serve mode (`mode: serve`, docs/serve.md) plays the
same environments with `play_served_episode`: each model turn is a chat completion under one
`X-Session-Id`, the conversation so far as its messages, so the endpoint's session continues one token
sequence (the model's tokens trained, the environment's masked out, as in `multi_turn`); the
episode's reward (the sum of the step rewards) is the session's feedback, and `commit=True` puts the
session into the buffer. Nothing here runs inside the explorer: it is a client, like any application.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.explorer.tasks import Task
from services.explorer.workflows.multi_turn import close_environment, maybe_await, step_result


@dataclass
class ServedEpisode:
    """What an episode played through the endpoint did: its messages, rewards and end."""

    session_id: str
    messages: list[dict[str, str]]
    rewards: list[float] = field(default_factory=list)  # one per model turn
    completion_tokens: int = 0  # the model's tokens over all turns, as the endpoint counted them
    done: bool = False
    info: dict[str, str] = field(default_factory=dict)
    committed: dict[str, Any] | None = None  # the endpoint's answer to the commit

    @property
    def reward(self) -> float:
        return float(sum(self.rewards))


def row_task(row: Mapping[str, Any], index: int = 0, name: str = "served") -> Task:
    """A task for an environment's `reset` from a plain row (an application has no taskset)."""
    return Task(task_id=f"{name}/{index}", index=index, taskset=name, raw=dict(row), workflow="multi_turn")


async def play_served_episode(
    env: Any,
    client: Any,
    session_id: str,
    task: Task | Mapping[str, Any] | None = None,
    *,
    max_turns: int = 4,
    model: str = "policy",
    system_prompt: str | None = None,
    commit: bool = True,
    **create_args: Any,
) -> ServedEpisode:
    """Play one episode of `env` with the policy behind `client` (an `openai.AsyncOpenAI` on the
    endpoint's `/v1`); `create_args` go to each `chat.completions.create` (`max_tokens`, ...)."""
    if task is None or isinstance(task, Mapping):
        task = row_task(task or {})
    headers = {"X-Session-Id": session_id}
    try:
        first = await maybe_await(env.reset(task))
        messages: list[dict[str, str]] = (
            [{"role": "system", "content": system_prompt}] if system_prompt else []
        )
        messages.append({"role": "user", "content": str(first)})
        episode = ServedEpisode(session_id=session_id, messages=messages)
        for turn in range(max_turns):
            reply = await client.chat.completions.create(
                model=model, messages=messages, extra_headers=headers, **create_args
            )
            text = reply.choices[0].message.content or ""
            episode.completion_tokens += reply.usage.completion_tokens if reply.usage else 0
            messages.append({"role": "assistant", "content": text})
            observation, reward, done, info = step_result(await maybe_await(env.step(text)))
            episode.rewards.append(reward)
            episode.done, episode.info = done, info
            if done or turn == max_turns - 1:
                break
            messages.append({"role": "user", "content": observation})
    finally:
        await close_environment(env)
    await client.post("/feedback", body={"session_id": session_id, "reward": episode.reward}, cast_to=object)
    if commit:
        episode.committed = await client.post("/commit", body={"session_ids": [session_id]}, cast_to=object)
    return episode
