"""Auxiliary models for workflows (`explorer.auxiliary_models`): an LLM judge or reward model reached
through an OpenAI-compatible HTTP API with the official `openai` client, or a local HF model.

A model with `api_base` becomes an `OpenAIModel` (key from the environment variable `api_key_env`);
one with only `model_path` runs in-process as an `hf` engine behind a ModelWrapper. Workflows get them
in config order as `auxiliary_models[i]`; both kinds offer `chat_async(messages, **args) -> str`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.config import InferenceModelConfig
from services.common.sampling import SamplingParams
from services.explorer.model_wrapper import ModelWrapper


class OpenAIModel:
    """Chat completions against `api_base` (`/v1/chat/completions`)."""

    def __init__(self, cfg: InferenceModelConfig, *, timeout_s: float = 60.0, max_retries: int = 2):
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - exercised only where openai is missing
            raise RuntimeError(
                "explorer.auxiliary_models with api_base need the `openai` package: pip install 'openai>=1.40'"
            ) from exc
        if not cfg.api_base:
            raise ValueError("an OpenAI-compatible auxiliary model needs api_base")
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        if cfg.api_key_env and not key:
            raise RuntimeError(
                f"auxiliary model {cfg.name or cfg.api_base}: environment variable {cfg.api_key_env} is empty"
            )
        self.model_name = cfg.name or cfg.model_path or "default"
        self._client_args = {
            "base_url": cfg.api_base,
            "api_key": key or "EMPTY",
            "timeout": timeout_s,
            "max_retries": max_retries,
        }
        self.client = openai.AsyncOpenAI(**self._client_args)
        self._sync_client: Any = None

    async def chat_completion(self, messages: Sequence[Mapping[str, str]], **args: Any) -> Any:
        """The raw `ChatCompletion` (all choices, usage)."""
        return await self.client.chat.completions.create(
            model=self.model_name, messages=list(messages), **args
        )

    async def chat_async(self, messages: Sequence[Mapping[str, str]], **args: Any) -> str:
        reply = await self.chat_completion(messages, **args)
        return reply.choices[0].message.content or ""

    def chat(self, messages: Sequence[Mapping[str, str]], **args: Any) -> str:
        """Blocking form for sync workflows (they run in worker threads, never on the event loop)."""
        import openai

        if self._sync_client is None:
            self._sync_client = openai.OpenAI(**self._client_args)
        reply = self._sync_client.chat.completions.create(
            model=self.model_name, messages=list(messages), **args
        )
        return reply.choices[0].message.content or ""

    async def close(self) -> None:
        await self.client.close()


class LocalChatModel:
    """A local HF model as a judge: `chat_async` returns the text of one sample, greedy unless the call
    overrides `temperature`, with at most `max_response_tokens` of its config (`path` names that key in
    errors: there is no built-in limit)."""

    def __init__(self, wrapper: ModelWrapper, cfg: InferenceModelConfig, path: str):
        self.wrapper = wrapper
        self.cfg = cfg
        self.path = path

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        limit = overrides.pop("max_tokens", self.cfg.max_response_tokens)
        if limit is None:
            raise ValueError(
                f"{self.path}.max_response_tokens: not set, and a local auxiliary model needs a reply-token "
                "limit; set it (e.g. 256) or pass max_tokens to chat_async"
            )
        greedy = SamplingParams(
            temperature=0.0, top_p=1.0, top_k=-1, max_tokens=limit, min_tokens=0, repetition_penalty=1.0,
            ignore_eos=self.cfg.ignore_eos, logprobs=0, stop=(),
        )  # fmt: skip
        return greedy.replace(**overrides)

    async def chat_async(self, messages: Sequence[Mapping[str, str]], **args: Any) -> str:
        return (await self.wrapper.chat_async(messages, self.sampling_params(**args)))[0].response_text

    async def close(self) -> None:
        await self.wrapper.engine.close()


def build_auxiliary_models(
    configs: Sequence[InferenceModelConfig], devices: Sequence[str | None] | None = None
) -> list[Any]:
    """One model per config; `devices[i]` places a local one (its first GPU; placement.py)."""
    out: list[Any] = []
    for i, cfg in enumerate(configs):
        device = devices[i] if devices is not None else None
        if cfg.api_base:
            out.append(OpenAIModel(cfg))
        else:
            from services.explorer.engines import ENGINES

            engine = ENGINES.get(cfg.engine_type if cfg.engine_type != "openai" else "hf")(
                cfg, str(cfg.model_path), index=0, device=device
            )
            # the model's own prompt limit and template; its reply limit is max_response_tokens
            wrapper = ModelWrapper(
                engine,
                max_prompt_tokens=cfg.max_prompt_tokens,
                chat_template=cfg.chat_template,
                enable_thinking=cfg.enable_thinking,
            )
            out.append(LocalChatModel(wrapper, cfg, f"explorer.auxiliary_models[{i}]"))
    return out
