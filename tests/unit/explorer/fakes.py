"""Test doubles that implement the real RolloutEngine protocol (no model): scripted replies."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import torch

from services.common.config import RFTConfig, resolve
from services.explorer.engines.base import GenerationOutput, SamplingParams, per_prompt_params


def sampling(**fields) -> SamplingParams:
    """The default config's sampling params (`model.*` defaults) with `fields` replaced; a test gives
    `max_tokens`, as the default config resolves none."""
    return resolve(RFTConfig()).sampling_params(**fields)


class CharTokenizer:
    """One token per character (ids = code points), enough for the ModelWrapper."""

    eos_token_id = 0
    pad_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kw) -> str:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


class ScriptedEngine:
    """Replies with the next text of `replies` (cycled); log-prob -0.5 per token."""

    name = "scripted"

    def __init__(self, replies: Iterable[str] = ("42",), vocab_size: int = 0x110000):
        self._replies = itertools.cycle(list(replies))
        self._tokenizer = CharTokenizer()
        self._version = 0
        self.vocab_size = vocab_size
        self.calls: list[tuple[list[int], SamplingParams]] = []
        self.generated = 0

    @property
    def model_version(self) -> int:
        return self._version

    @property
    def tokenizer(self):
        return self._tokenizer

    async def generate(self, prompts, params):
        out = []
        for prompt, p in zip(prompts, per_prompt_params(prompts, params), strict=True):
            self.calls.append((list(prompt), p))
            group = []
            for _ in range(p.n):
                ids = self._tokenizer.encode(next(self._replies))[: p.max_tokens]
                self.generated += len(ids)
                group.append(
                    GenerationOutput(
                        prompt_token_ids=list(prompt),
                        token_ids=ids,
                        logprobs=torch.full((len(ids),), -0.5),
                        finish_reason="stop",
                        text=self._tokenizer.decode(ids),
                        model_version=self._version,
                    )
                )
            out.append(group)
        return out

    async def load_weights(self, named_tensors, version: int) -> None:
        list(named_tensors)
        self._version = version

    def stats(self) -> dict[str, float]:
        return {"generated_tokens": float(self.generated), "generate_seconds": 1.0}

    async def close(self) -> None:
        pass
