"""The rollout engine contract every engine (`hf`, `vllm`) implements, and the records it exchanges.

An engine turns prompts (token ids) into sampled continuations and reports, for every sampled token,
its log-probability under the *sampling* distribution: logits divided by the temperature, then top-k
and top-p filtered and renormalised (vLLM's `processed_logprobs`). The trainer recomputes log-probs
with its own model and the same temperature, so these are the "old" policy's numbers.

Engines are async: explorer workflows run concurrently on one event loop and the engine batches
their requests. `load_weights(named_tensors, version)` swaps in new policy weights between batches
and bumps `model_version`, which every output carries (the weights that produced it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

import torch

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling arguments (vLLM names and meaning).

    temperature 0 = greedy; top_k <= 0 = off; top_p 1 = off. `n` samples per prompt. `stop` strings end
    a sample (the text is cut before the stop string; its tokens stay in `token_ids`), as do
    `stop_token_ids` and EOS unless `ignore_eos`; none of them can end it before `min_tokens`.
    `repetition_penalty` (1 = off) divides the positive logits and multiplies the negative ones of
    every token already in the prompt or the sample (Keskar et al. 2019, CTRL; HF and vLLM meaning). `logprobs` is kept for API parity: the log-prob of
    every sampled token is always returned.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None  # required: there is no hidden limit
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is None:
            raise ValueError("max_tokens is required (the config resolves it from model.max_response_tokens)")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))

    @classmethod
    def from_args(cls, args: Mapping[str, Any], **overrides: Any) -> SamplingParams:
        """Build from a rollout-args dict (`Resolved.rollout_args`); None values keep the defaults, except
        `max_tokens`, which must be given."""
        known = cls.__dataclass_fields__
        merged = {k: v for k, v in {**dict(args), **overrides}.items() if k in known and v is not None}
        if "max_tokens" not in merged:  # no hidden limit: the config always resolves one (resolved.py)
            raise ValueError(
                "no max_tokens in the sampling args: set model.max_response_tokens (or the taskset's "
                "rollout_args.max_tokens, or model.max_model_len with model.max_prompt_tokens)"
            )
        if merged.get("top_k") == 0:
            merged["top_k"] = -1
        return cls(**merged)

    def with_(self, **changes: Any) -> SamplingParams:
        return replace(self, **changes)


@dataclass
class GenerationOutput:
    """One sample. Shapes: token_ids (R,), logprobs (R,) float32 where R = len(token_ids)."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: torch.Tensor
    finish_reason: FinishReason
    text: str = ""
    model_version: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@runtime_checkable
class RolloutEngine(Protocol):
    """What the explorer needs from an inference engine."""

    name: str

    @property
    def model_version(self) -> int: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def vocab_size(self) -> int: ...

    async def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[list[GenerationOutput]]:
        """For each prompt, `params.n` samples (in order)."""
        ...

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...

    def stats(self) -> dict[str, float]:
        """Cumulative counters: generated_tokens, generate_seconds, requests."""
        ...

    async def close(self) -> None: ...


def per_prompt_params(
    prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
    return params
