"""`multi_turn`: a conversation with an environment, trained as one concatenated sequence.

The environment (Protocol below; by name from `ENVIRONMENTS` or a dotted-path plug-in, chosen by
`workflow_args.env`, built with `workflow_args.env_args`) gives a first observation on `reset(task)`
and answers each model turn with `step(action) -> (observation, reward, done)`. The Experience holds
prompt + [turn 1, observation 1, turn 2, ...]: model tokens have `action_mask` True and their engine
log-probs; observation tokens (the chat-template text between two model turns) have mask False and
log-prob 0, so the trainer learns only from what the model said. Reward = sum of step rewards.
Either method may be `async def`.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Protocol, runtime_checkable

import torch

from services.common.experience import Experience
from services.common.registry import Registry
from services.explorer.tasks import Task
from services.explorer.workflows.base import WORKFLOWS, WorkflowBase


@runtime_checkable
class Environment(Protocol):
    def reset(self, task: Task) -> Any:
        """The first observation (str), or an awaitable of it."""
        ...

    def step(self, action: str) -> Any:
        """(observation, reward, done), or an awaitable of it."""
        ...


ENVIRONMENTS: Registry[Any] = Registry("environment")


@ENVIRONMENTS.register("guess_number")
class GuessNumberEnv:
    """Guess the row's `target` (an integer in [low, high]); the env answers higher/lower."""

    def __init__(self, low: int = 0, high: int = 9):
        self.low, self.high = low, high
        self.target = low

    def reset(self, task: Task) -> str:
        self.target = int(task.raw.get("target", self.low + task.index % (self.high - self.low + 1)))
        return f"Guess my number between {self.low} and {self.high}."

    def step(self, action: str) -> tuple[str, float, bool]:
        found = re.search(r"-?\d+", action)
        if not found:
            return "Say a number.", 0.0, False
        guess = int(found.group())
        if guess == self.target:
            return "Correct!", 1.0, True
        return ("Higher." if guess < self.target else "Lower."), 0.0, False


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@WORKFLOWS.register("multi_turn")
class MultiTurnWorkflow(WorkflowBase):
    is_async = True
    can_repeat = False  # each episode is its own environment
    requires_ground_truth = False

    def _env(self) -> Environment:
        name = self.args.get("env", "guess_number")
        factory = ENVIRONMENTS.get(name) if isinstance(name, str) else name
        return factory(**dict(self.args.get("env_args", {})))

    async def run_async(self) -> list[Experience]:
        env = self._env()
        max_turns = int(self.args.get("max_turns", 4))
        sampling = {k: v for k, v in self.task.rollout_args.items() if k != "n"}
        if not sampling.get("max_tokens"):
            raise ValueError(
                "multi_turn needs a per-turn token limit: set model.max_response_tokens or the taskset's "
                "rollout_args.max_tokens"
            )
        per_turn = int(sampling["max_tokens"])
        budget = int(self.args.get("max_response_tokens", per_turn * max_turns))

        first = str(await _maybe_await(env.reset(self.task)))
        messages: list[dict[str, str]] = []
        if system := self.task.system_prompt():
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": first})
        prompt_text = self.model.render(messages)
        prompt, _ = self.model.fit_prompt(self.model.encode_text(prompt_text))
        rendered = prompt_text
        response: list[int] = []
        mask: list[bool] = []
        logprobs: list[torch.Tensor] = []
        total_reward, turns, done, version = 0.0, 0, False, self.model.model_version
        for turn in range(max_turns):
            args = {**sampling, "max_tokens": max(1, min(per_turn, budget - len(response)))}
            out = (await self.model.generate_tokens_async(prompt + response, **args))[0]
            version = out.model_version
            response += out.token_ids
            mask += [True] * len(out.token_ids)
            logprobs.append(out.logprobs)
            messages.append({"role": "assistant", "content": out.text})
            observation, reward, done = await _maybe_await(env.step(out.text))
            total_reward += float(reward)
            turns = turn + 1
            if done or turn == max_turns - 1:
                break
            messages.append({"role": "user", "content": str(observation)})
            obs_ids, rendered = self._observation_tokens(messages, rendered, out.token_ids, out.text)
            if len(response) + len(obs_ids) >= budget:
                break
            response += obs_ids
            mask += [False] * len(obs_ids)
            logprobs.append(torch.zeros(len(obs_ids)))
        exp = Experience(
            tokens=prompt + response,
            prompt_length=len(prompt),
            logprobs=torch.cat(logprobs) if logprobs else torch.zeros(0),
            action_mask=mask,
            reward=total_reward,
            truncated=not done,
            model_version=version,
            prompt_text=prompt_text,
            response_text="\n".join(m["content"] for m in messages[1:]),
            metrics={"reward": total_reward, "turns": float(turns), "response_length": float(len(response))},
        )
        exp.metrics["accuracy"] = float(total_reward >= float(self.args.get("correct_threshold", 1.0)))
        return [exp]

    def _observation_tokens(
        self, messages: list[dict[str, str]], rendered: str, action_ids: list[int], action_text: str
    ) -> tuple[list[int], str]:
        """Tokens of the template text between the model's last turn and its next one: the conversation
        rendered with the new observation, minus what the model has already seen or said."""
        after = self.model.render(messages, add_generation_prompt=True)
        said = self.model.tokenizer.decode(action_ids, skip_special_tokens=False)
        for prefix in (rendered + said, rendered + action_text):
            if after.startswith(prefix):
                return self.model.encode_text(after[len(prefix) :]), after
        # the template rewrites history (e.g. strips thinking): append the new message on its own
        return self.model.encode_messages(messages[-1:]), after
