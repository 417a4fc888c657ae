"""What a workflow holds as `model`: a rollout engine plus its tokenizer, prompt limits and the task's
sampling arguments, returning Experiences (Trinity-RFT's ModelWrapper).

Every sampling call takes an optional `SamplingParams` (a workflow passes `self.task.sampling`) and
keyword overrides of its fields (`n=`, `temperature=`, `max_tokens=`): the engine gets
`(sampling or model.sampling).replace(**overrides)`. `model.sampling` is the task's (set by the
explorer); a wrapper with none refuses a call that gives none.

Async workflows call `chat_async` / `generate_async` / `generate_tokens_async`. Sync workflows run in
a worker thread and call `chat` / `generate`, which hand the request to the event loop and wait.
Prompts longer than `max_prompt_tokens` keep their last tokens (the generation prompt is at the end)
when `enable_prompt_truncation`, else the task fails with `PromptTooLong` (not retried).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from services.common import tracing
from services.common.experience import Experience
from services.explorer.engines.base import GenerationOutput, RolloutEngine, SamplingParams

T = TypeVar("T")


class PromptTooLong(ValueError):
    """A prompt exceeds `model.max_prompt_tokens` and truncation is off."""


class ModelWrapper:
    def __init__(
        self,
        engine: RolloutEngine,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        max_prompt_tokens: int | None = None,
        enable_prompt_truncation: bool = True,
        chat_template: str | None = None,
        enable_thinking: bool | None = None,
        sampling: SamplingParams | None = None,
        tool_call_parser: str | None = None,
    ):
        self.engine = engine
        self.loop = loop
        self.max_prompt_tokens = max_prompt_tokens
        self.enable_prompt_truncation = enable_prompt_truncation
        self.chat_template = chat_template
        self.enable_thinking = enable_thinking
        self.sampling = sampling
        self.tool_call_parser = tool_call_parser  # services/explorer/tools/parser.py; None = hermes

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def model_version(self) -> int:
        return self.engine.model_version

    # ------------------------------------------------------------------ prompts
    def render(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True, **kw: Any
    ) -> str:
        """The chat template applied to `messages` as text."""
        extra: dict[str, Any] = {}
        thinking = kw.pop("enable_thinking", self.enable_thinking)
        if thinking is not None:
            extra["enable_thinking"] = thinking
        template = kw.pop("chat_template", None) or self.chat_template
        if template:
            extra["chat_template"] = template
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **extra, **kw
        )

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_messages(self, messages: Sequence[Mapping[str, str]], **kw: Any) -> list[int]:
        return self.encode_text(self.render(messages, **kw))

    def fit_prompt(self, ids: list[int]) -> tuple[list[int], bool]:
        """(prompt ids within max_prompt_tokens, whether they were cut)."""
        limit = self.max_prompt_tokens
        if limit is None or len(ids) <= limit:
            return ids, False
        if not self.enable_prompt_truncation:
            raise PromptTooLong(
                f"prompt has {len(ids)} tokens > model.max_prompt_tokens {limit} and enable_prompt_truncation is off"
            )
        return ids[-limit:], True

    def sampling_params(self, sampling: SamplingParams | None = None, **overrides: Any) -> SamplingParams:
        """`sampling` (else the wrapper's) with `overrides` applied."""
        base = sampling if sampling is not None else self.sampling
        if base is None:
            raise ValueError(
                "no sampling params: pass the task's (`self.task.sampling`), or set ModelWrapper.sampling"
            )
        return base.replace(**overrides)

    # ------------------------------------------------------------------ async API
    async def generate_tokens_async(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, **overrides: Any
    ) -> list[GenerationOutput]:
        """`n` samples for one tokenised prompt (no truncation: the caller owns the ids)."""
        params = self.sampling_params(sampling, **overrides)
        with tracing.child_span("explorer.generate", {"rft.samples": params.n}):
            return (await self.engine.generate([list(prompt_ids)], params))[0]

    async def _sample(self, ids: list[int], prompt_text: str, params: SamplingParams) -> list[Experience]:
        ids, cut = self.fit_prompt(ids)
        outs = await self.generate_tokens_async(ids, params)
        return [self.to_experience(o, prompt_text, prompt_truncated=cut) for o in outs]

    async def chat_async(
        self, messages: Sequence[Mapping[str, str]], sampling: SamplingParams | None = None, **overrides: Any
    ) -> list[Experience]:
        params = self.sampling_params(sampling, **overrides)
        text = self.render(messages)
        return await self._sample(self.encode_text(text), text, params)

    async def generate_async(
        self, prompts: Sequence[str], sampling: SamplingParams | None = None, **overrides: Any
    ) -> list[Experience]:
        params = self.sampling_params(sampling, **overrides)
        results = await asyncio.gather(*(self._sample(self.encode_text(p), p, params) for p in prompts))
        return [e for r in results for e in r]

    # ------------------------------------------------------------------ sync API (worker threads)
    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop is None:
            coro.close()
            raise RuntimeError(
                "sync model calls need the wrapper's event loop (run the workflow via the runner)"
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError("sync model call from the event loop thread; use the *_async method")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def chat(
        self, messages: Sequence[Mapping[str, str]], sampling: SamplingParams | None = None, **overrides: Any
    ) -> list[Experience]:
        return self._call(self.chat_async(messages, sampling, **overrides))

    def generate(
        self, prompts: Sequence[str], sampling: SamplingParams | None = None, **overrides: Any
    ) -> list[Experience]:
        return self._call(self.generate_async(prompts, sampling, **overrides))

    def generate_tokens(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, **overrides: Any
    ) -> list[GenerationOutput]:
        return self._call(self.generate_tokens_async(prompt_ids, sampling, **overrides))

    # ------------------------------------------------------------------ records
    @staticmethod
    def to_experience(
        out: GenerationOutput, prompt_text: str = "", prompt_truncated: bool = False
    ) -> Experience:
        prompt = list(out.prompt_token_ids)
        exp = Experience(
            tokens=prompt + list(out.token_ids),
            prompt_length=len(prompt),
            logprobs=out.logprobs,
            action_mask=[True] * len(out.token_ids),
            truncated=out.truncated,
            model_version=out.model_version,
            token_model_versions=out.token_model_versions,
            prompt_text=prompt_text,
            response_text=out.text,
            metrics={"response_length": float(len(out.token_ids)), "prompt_length": float(len(prompt))},
        )
        if prompt_truncated:
            exp.info["prompt_truncated"] = "1"
        return exp
