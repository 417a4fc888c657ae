"""`multi_turn`: a conversation with an environment, trained as one concatenated sequence.

The environment (Protocol below; by name from `ENVIRONMENTS` or a dotted-path plug-in, chosen by
`workflow_args.env`, built with `workflow_args.env_args`) gives a first observation on `reset(task)`
and answers each model turn with `step(action) -> (observation, reward, done)` or, gym-style,
`(observation, reward, done, info)`; an optional `close()` ends the episode (a connection, a game).
Any of them may be `async def`. The same object is what the adapters of environment libraries are
(openenv_env.py: an OpenEnv server; text_games.py: a TextArena game) and what `served.py` plays through
serve mode's OpenAI endpoint as one session, so an environment written once runs in all three.

The Experience holds prompt + [turn 1, observation 1, turn 2, ...]: model tokens have `action_mask`
True and their engine log-probs; observation tokens (the chat-template text between two model turns)
have mask False and log-prob 0, so the trainer learns only from what the model said. Reward = sum of
step rewards; when a turn before the last one is rewarded, `token_level_rewards` holds each step's
reward on the last token of the model turn it answered (per-turn credit; the sum is the same). `info`
of the last step (values as strings) goes into the Experience's `info`.

Tools: when the row has a list of OpenAI tool specs under `format.tools_key` (default "tools"), or
`workflow_args.tools`, or the environment has a `tools` attribute, the specs are rendered into the
prompt (services/explorer/tools/template.py) and each model turn is parsed with the parser named by
`explorer.rollout_model.tool_call_parser` (default `hermes`; `workflow_args.tool_call_parser`
overrides). A turn with tool calls goes to the environment's `call_tool(call: ToolCall) -> str`
(when it has one): each result is appended as a `role: tool` message (masked out, like any
observation) and the model speaks again; a turn without calls goes to `step` as before. Metrics
`tool_calls` and `tool_parse_errors` count per episode.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Protocol, runtime_checkable

import torch

from services.common.experience import Experience
from services.common.registry import Registry
from services.explorer.tasks import BadRow, Task
from services.explorer.tools import TOOL_CALL_PARSERS, render_prompt
from services.explorer.workflows.base import WORKFLOWS, WorkflowBase


@runtime_checkable
class Environment(Protocol):
    def reset(self, task: Task) -> Any:
        """The first observation (str), or an awaitable of it."""
        ...

    def step(self, action: str) -> Any:
        """(observation, reward, done) or (observation, reward, done, info), or an awaitable of it."""
        ...

    # optional: `close()` (or `async def close()`), called once when the episode ends, however it ends


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def step_result(value: Any) -> tuple[str, float, bool, dict[str, str]]:
    """A step's return value as (observation, reward, done, info): 3- and 4-tuples are accepted, a
    reward of None counts 0, info values become strings."""
    if not isinstance(value, (tuple, list)) or len(value) not in (3, 4):
        raise TypeError(
            f"an environment's step() must return (observation, reward, done[, info]), got {value!r}"
        )
    observation, reward, done = value[0], value[1], value[2]
    info = value[3] if len(value) == 4 and value[3] is not None else {}
    if not isinstance(info, dict):
        raise TypeError(f"the info of an environment's step() must be a dict, got {info!r}")
    return str(observation), float(reward or 0.0), bool(done), {str(k): str(v) for k, v in info.items()}


async def close_environment(env: Any) -> None:
    """Call the environment's `close()` when it has one (sync or async)."""
    close = getattr(env, "close", None)
    if callable(close):
        await maybe_await(close())


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


@WORKFLOWS.register("multi_turn")
class MultiTurnWorkflow(WorkflowBase):
    is_async = True
    can_repeat = False  # each episode is its own environment
    requires_ground_truth = False

    default_env = "guess_number"
    default_max_turns = 4
    env_arg_names: tuple[str, ...] = ()  # workflow_args keys also passed to the environment
    _tool_specs: list[dict[str, Any]] | None = None

    def _env(self) -> Environment:
        name = self.args.get("env", self.default_env)
        factory = ENVIRONMENTS.get(name) if isinstance(name, str) else name
        options = {k: self.args[k] for k in self.env_arg_names if k in self.args}
        return factory(**{**options, **dict(self.args.get("env_args", {}))})

    def _tools(self, env: Any) -> list[dict[str, Any]] | None:
        """The row's tool specs (`format.tools_key`), else `workflow_args.tools`, else `env.tools`."""
        key = self.task.format.tools_key
        tools = self.task.raw.get(key) or self.args.get("tools") or getattr(env, "tools", None)
        if tools is None:
            return None
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise BadRow(
                f"tools (row key {key!r}, workflow_args.tools or the environment's) must be a list of "
                'OpenAI tool specs like {"type": "function", "function": {"name": ..., "parameters": {...}}}'
            )
        return tools or None

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not self._tool_specs:
            return self.model.render(messages, add_generation_prompt=add_generation_prompt)
        extra = {} if self.model.enable_thinking is None else {"enable_thinking": self.model.enable_thinking}
        return render_prompt(
            self.model.tokenizer,
            messages,
            self._tool_specs,
            self.model.chat_template,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )

    async def run_async(self) -> list[Experience]:
        env = self._env()
        try:
            return await self._episode(env)
        finally:
            await close_environment(env)

    async def _episode(self, env: Environment) -> list[Experience]:
        self._tool_specs = self._tools(env)
        parse = self._tool_call_parser() if self._tool_specs else None  # a typo fails before sampling
        call_tool = getattr(env, "call_tool", None)
        tool_calls = parse_errors = 0
        max_turns = int(self.args.get("max_turns", self.default_max_turns))
        sampling = self.model.sampling_params(self.task.sampling, n=1)
        per_turn = sampling.max_tokens  # the taskset's limit, per turn
        budget = int(self.args.get("max_response_tokens", per_turn * max_turns))

        messages, prompt_text, prompt = await self._opening(env)
        rendered = prompt_text
        response: list[int] = []
        mask: list[bool] = []
        logprobs: list[torch.Tensor] = []
        total_reward, turns, done, version = 0.0, 0, False, self.model.model_version
        turn_rewards: list[tuple[int, float]] = []  # (response position of the turn's last token, reward)
        info: dict[str, str] = {}
        for turn in range(max_turns):
            turn_limit = max(1, min(per_turn, budget - len(response)))
            out = (
                await self.model.generate_tokens_async(prompt + response, sampling, max_tokens=turn_limit)
            )[0]
            version = out.model_version
            response += out.token_ids
            mask += [True] * len(out.token_ids)
            logprobs.append(out.logprobs)
            # the model's text as it said it (tool-call tags included): the next prompt extends it exactly
            messages.append({"role": "assistant", "content": out.text})
            turns = turn + 1
            parsed = parse(out.text) if parse is not None else None
            if parsed is not None:
                parse_errors += parsed.parse_errors
            if parsed is not None and parsed.tool_calls and call_tool is not None:
                tool_calls += len(parsed.tool_calls)
                messages += [await _tool_message(call_tool, call) for call in parsed.tool_calls]
                if turn == max_turns - 1:
                    break
            else:
                observation, reward, done, info = step_result(await maybe_await(env.step(out.text)))
                total_reward += reward
                if response:
                    turn_rewards.append((len(response) - 1, reward))
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
            info=info,
        )
        if any(r != 0.0 for _, r in turn_rewards[:-1]):  # a turn before the last one was rewarded
            exp.token_level_rewards = _per_token_rewards(turn_rewards, len(response))
        if self._tool_specs:
            exp.metrics |= {"tool_calls": float(tool_calls), "tool_parse_errors": float(parse_errors)}
        exp.metrics["accuracy"] = float(total_reward >= float(self.args.get("correct_threshold", 1.0)))
        return [exp]

    def _tool_call_parser(self) -> Any:
        """The parser of `tool_call_parser` (workflow args, else the model's; default `hermes`)."""
        parser = str(
            self.args.get("tool_call_parser") or getattr(self.model, "tool_call_parser", None) or "hermes"
        )
        return TOOL_CALL_PARSERS.get(parser)

    async def _opening(self, env: Environment) -> tuple[list[dict[str, Any]], str, list[int]]:
        """The first prompt: (messages, its rendered text, its token ids fitted to the prompt limit)."""
        first = str(await maybe_await(env.reset(self.task)))
        messages: list[dict[str, Any]] = []
        if system := self.task.system_prompt():
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": first})
        prompt_text = self._render(messages)
        prompt, _ = self.model.fit_prompt(self.model.encode_text(prompt_text))
        return messages, prompt_text, prompt

    def _observation_tokens(
        self, messages: list[dict[str, Any]], rendered: str, action_ids: list[int], action_text: str
    ) -> tuple[list[int], str]:
        """Tokens of the template text between the model's last turn and its next one: the conversation
        rendered with the new observation, minus what the model has already seen or said."""
        after = self._render(messages, add_generation_prompt=True)
        said = self.model.tokenizer.decode(action_ids, skip_special_tokens=False)
        for prefix in (rendered + said, rendered + action_text):
            if after.startswith(prefix):
                return self.model.encode_text(after[len(prefix) :]), after
        # the template rewrites history (e.g. strips thinking): append the new messages on their own
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        tail = messages[last + 1 :]
        if self._tool_specs:
            text = render_prompt(self.model.tokenizer, tail, None, self.model.chat_template)
        else:
            text = self.model.render(tail)
        return self.model.encode_text(text), after


async def _tool_message(call_tool: Any, call: Any) -> dict[str, Any]:
    """The `tool` message answering one parsed tool call."""
    result = await maybe_await(call_tool(call))
    return {"role": "tool", "tool_call_id": call.id, "content": str(result)}


def _per_token_rewards(turn_rewards: list[tuple[int, float]], length: int) -> torch.Tensor:
    """Each turn's reward at the response position of its last token."""
    per_token = torch.zeros(length)
    for position, r in turn_rewards:
        per_token[position] += r
    return per_token
