"""The rollout engine contract every engine (`hf`, `vllm`) implements, and the records it exchanges.

An engine turns prompts (token ids) into sampled continuations and reports, for every sampled token,
its log-probability under the *sampling* distribution: logits divided by the temperature, then top-k
and top-p filtered and renormalised (vLLM's `processed_logprobs`). The trainer recomputes log-probs
with its own model and the same temperature, so these are the "old" policy's numbers.

Engines are async: explorer workflows run concurrently on one event loop and the engine batches
their requests. `load_weights(named_tensors, version)` swaps in new policy weights between batches
and bumps `model_version`, which every output carries (the weights that produced it). An engine that
can take weights mid-generation has `set_inflight_updates(True)` (explorer.inflight_weight_update):
then a load lands between decode steps of the running requests, the rest of each response comes from
the new weights, every output lists per token the version that sampled it (`token_model_versions`),
and its `model_version` is the version it started with. Requests carry a
`SamplingParams` (services/common/sampling.py), built from the config.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from services.common.sampling import SamplingParams

FinishReason = Literal["stop", "length", "abort"]


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
    # per sampled token, the k most likely (token id, log-prob) of its sampling distribution, when asked
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # (R,) per sampled token, the weights' version that sampled it: filled by an engine with in-flight
    # weight updates on (a version may land mid-generation); None: every token is of `model_version`
    token_model_versions: list[int] | None = None

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

    async def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, strict: bool = True
    ) -> None:
        """Load the tensors; `strict`: they cover every parameter (False: a subset, e.g. merged LoRA layers)."""
        ...

    def stats(self) -> dict[str, float]:
        """Cumulative counters: generated_tokens, generate_seconds, requests."""
        ...

    async def close(self) -> None: ...


class EngineState:
    """The part of `RolloutEngine` every engine keeps alike: it sets `_version` (the weights' version),
    `_tokenizer` and `_stats` (the cumulative counters), and these answer from them."""

    _version: int
    _tokenizer: Any
    _stats: dict[str, float]

    @property
    def model_version(self) -> int:
        return self._version

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def stats(self) -> dict[str, float]:
        return dict(self._stats)


def per_prompt_params(
    prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
    return params
