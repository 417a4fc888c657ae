"""`verifiers`: an environment of the `verifiers` library (prime-rl's) run as a workflow.

A verifiers environment brings its own dataset (rows with a chat `prompt`, an `answer`, `info`), its
parser and its rubric (weighted reward functions), and, for a `MultiTurnEnv`, its own `env_response`
between the model's turns; it drives the model through a verifiers `Client`. This workflow runs the
environment's own rollout (`Environment.run_rollout`: turns, stop conditions, scoring by the rubric)
with `PolicyClient`, a verifiers `Client` answered by the explorer's model (the rollout engine, never an
HTTP endpoint), so nothing is reached but the environment's own code:
- the environment: `workflow_args.environment`, a plug-in path `module:load_environment` (a function
  returning a `vf.Environment`, verifiers' convention) or the id of an installed verifiers environment
  package (`vf.load_environment(id)`), built with `workflow_args.env_args`, once per process;
- the example: row `example_id` (else the row's index) of the environment's dataset (its
  `eval_dataset` for eval tasksets when it has one), modulo its length; the taskset's rows choose
  which examples are played, and the taskset's `sampling` arguments (not the environment's) sample;
- each model turn: the chat messages verifiers passes are rendered with the model's chat template; a
  prompt that continues the previous turn's prompt and answer (as text) reuses their token ids, so a
  multi-turn rollout is one token sequence;
- the Experience: the prompt, then each turn's tokens (`action_mask` True, engine log-probs) with the
  environment's messages between turns masked out (a turn whose prompt does not continue the previous
  one starts another Experience of the same group); reward = the rubric's reward; `metrics` = the
  rubric's metrics; `truncated` = verifiers' `is_truncated`.

An environment whose dataset is loaded from the Hub (`datasets.load_dataset`) or that calls a judge
model needs what it fetches; offline, write the environment over local rows (`Dataset.from_list`) as
`examples/vf_envs/arithmetic_env.py` does. The library is the optional extra `rft-mesh[verifiers]`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import torch

from services.common.experience import Experience
from services.common.extras import import_extra
from services.common.registry import import_object
from services.explorer.workflows.base import WORKFLOWS, WorkflowBase

MISSING = (
    "the verifiers workflow needs the `verifiers` library, which is not installed here: install the "
    "`verifiers` extra (`uv pip install -e '.[verifiers]' -c requirements/constraints.txt`)"
)

_ENVIRONMENTS: dict[str, Any] = {}  # (environment, env_args) -> the built environment, once per process


def load_environment(spec: Any, env_args: dict[str, Any] | None = None) -> Any:
    """The verifiers environment named by `spec` (`module:function`, an installed id, or a function
    returning one), built once per process for each spec and arguments."""
    vf = import_extra("verifiers.legacy", MISSING)
    name = (
        spec
        if isinstance(spec, str)
        else f"{getattr(spec, '__module__', '')}:{getattr(spec, '__qualname__', id(spec))}"
    )
    key = json.dumps([name, env_args or {}], sort_keys=True, default=str)
    if key not in _ENVIRONMENTS:
        if callable(spec):
            env = spec(**(env_args or {}))
        elif ":" in spec:
            env = import_object(spec)(**(env_args or {}))
        else:
            env = vf.load_environment(spec, **(env_args or {}))
        if not isinstance(env, vf.Environment):
            raise TypeError(
                f"verifiers environment {spec!r} built {type(env).__name__}, not a vf.Environment"
            )
        _ENVIRONMENTS[key] = env
    return _ENVIRONMENTS[key]


def _message(m: Any) -> dict[str, str]:
    data = m.model_dump() if hasattr(m, "model_dump") else dict(m)
    content = data.get("content")
    if isinstance(content, list):  # content parts: the text ones
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return {"role": str(data.get("role", "user")), "content": "" if content is None else str(content)}


def policy_client(model: Any, sampling: Any) -> Any:
    """A verifiers `Client` whose answers are sampled by `model` (a ModelWrapper) with `sampling`."""
    import_extra("verifiers.legacy", MISSING)
    from verifiers.legacy.clients.client import Client
    from verifiers.legacy.types import Response, ResponseMessage, ResponseTokens

    class PolicyClient(Client):
        def __init__(self) -> None:
            super().__init__(model)
            self.text, self.ids = "", []  # the last prompt + answer, as text and as token ids
            self.version = model.model_version  # of the weights that sampled the last turn

        def setup_client(self, config: Any) -> Any:
            return model

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[list[dict[str, str]], dict]:
            return [_message(m) for m in messages], {}

        async def get_native_response(self, prompt, model_name, sampling_args, tools=None, **kwargs):
            text = model.render(prompt, add_generation_prompt=True)
            if self.ids and text.startswith(self.text):
                ids = self.ids + model.encode_text(text[len(self.text) :])
            else:
                ids, _ = model.fit_prompt(model.encode_text(text))
            out = (await model.generate_tokens_async(ids, sampling))[0]
            said = model.tokenizer.decode(out.token_ids, skip_special_tokens=False)
            self.text, self.ids = text + said, ids + list(out.token_ids)
            self.version = out.model_version
            return ids, out

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            ids, out = response
            n = len(out.token_ids)
            tokens = ResponseTokens(
                prompt_ids=list(ids),
                prompt_mask=[0] * len(ids),
                completion_ids=list(out.token_ids),
                completion_mask=[1] * n,
                completion_logprobs=[float(x) for x in out.logprobs.tolist()],
            )
            finish = "length" if out.finish_reason == "length" else "stop"
            message = ResponseMessage(
                role="assistant",
                content=out.text,
                finish_reason=finish,
                is_truncated=finish == "length",
                tokens=tokens,
            )
            return Response(
                id=f"policy-{uuid.uuid4().hex}", created=int(time.time()), model="policy", message=message
            )

        async def close(self) -> None:
            return None

    return PolicyClient()


@WORKFLOWS.register("verifiers")
class VerifiersWorkflow(WorkflowBase):
    is_async = True
    can_repeat = False  # each rollout is its own conversation with the environment
    requires_ground_truth = False

    def _example(self, env: Any) -> dict[str, Any]:
        dataset = (
            env.get_eval_dataset()
            if self.task.is_eval and env.eval_dataset is not None
            else env.get_dataset()
        )
        index = int(self.task.raw.get("example_id", self.task.index)) % len(dataset)
        return dict(dataset[index])

    async def run_async(self) -> list[Experience]:
        spec = self.args.get("environment")
        if spec is None or spec == "":
            raise ValueError(
                "workflow verifiers needs workflow_args.environment: 'module:load_environment' or the id "
                "of an installed verifiers environment"
            )
        env = load_environment(spec, dict(self.args.get("env_args", {})))
        sampling = self.model.sampling_params(self.task.sampling, n=1)
        client = policy_client(self.model, sampling)
        out = await env.run_rollout(self._example(env), client, "policy", {}, state_columns=["trajectory"])
        if out.get("error"):
            raise RuntimeError(f"the verifiers rollout failed: {out['error']}")
        reward = float(out.get("reward") or 0.0)
        metrics = {k: float(v) for k, v in (out.get("metrics") or {}).items() if isinstance(v, (int, float))}
        trajectory = out.get("trajectory") or []
        exps = self._experiences(trajectory, reward, bool(out.get("is_truncated")), client.version)
        for exp in exps:
            exp.metrics |= metrics | {"reward": reward}
            exp.info |= {"stop_condition": str(out.get("stop_condition") or "")}
        return exps

    def _experiences(
        self, steps: list[dict[str, Any]], reward: float, truncated: bool, version: int
    ) -> list[Experience]:
        """One Experience per chain of turns whose prompts continue each other (see the docstring)."""
        chains: list[dict[str, Any]] = []
        for step in steps:
            tokens = step.get("tokens")
            if not tokens:
                continue
            prompt, completion = list(tokens["prompt_ids"]), list(tokens["completion_ids"])
            logprobs = [float(x) for x in tokens["completion_logprobs"]]
            chain = chains[-1] if chains else None
            if chain is not None and prompt[: len(chain["tokens"])] == chain["tokens"]:
                between = prompt[len(chain["tokens"]) :]
                chain["mask"] += [False] * len(between) + [True] * len(completion)
                chain["logprobs"] += [0.0] * len(between) + logprobs
                chain["tokens"] += between + completion
            else:
                chains.append(
                    {
                        "prompt_length": len(prompt),
                        "tokens": prompt + completion,
                        "mask": [True] * len(completion),
                        "logprobs": logprobs,
                    }
                )
        return [
            Experience(
                tokens=c["tokens"],
                prompt_length=c["prompt_length"],
                logprobs=torch.tensor(c["logprobs"], dtype=torch.float32),
                action_mask=c["mask"],
                reward=reward,
                truncated=truncated,
                model_version=version,
                metrics={"turns": float(len(steps)), "response_length": float(len(c["mask"]))},
            )
            for c in chains
        ]
