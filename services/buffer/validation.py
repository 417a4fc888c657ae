"""Validation of incoming `ExperienceBatch`es: a bad batch is refused whole, naming the field and index.

Checks, per experience i (R = response length = len(tokens) - prompt_length):
- `tokens` non-empty, ids >= 0 and < the vocabulary size; same for `rejected_tokens`. The vocabulary
  size is the model's (`Limits.vocab_size`, read from the model folder's config.json at buffer start);
  a batch's own `vocab_size` may narrow it, never widen it; with neither, ids are only checked >= 0;
- 0 <= `prompt_length` < len(tokens) (at least one response token);
- `logprobs`, `action_mask`, `token_level_rewards`, `advantages`, `returns`, `teacher_logprobs` are
  empty or of length R;
- `reward`, `reward_baseline` and every float array finite; `model_version` and `use_count` >= 0;
and per batch: at most `max_batch_experiences` experiences and `max_batch_bytes` serialized bytes.

It works on the proto directly (no tensors): a float array is finite iff its sum in double precision is
(float32 values cannot overflow a double sum), so the common case costs one C-level `sum`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rft.v1 import experience_pb2

from services.buffer.records import ValidationError

RESPONSE_ARRAYS = (
    "logprobs",
    "action_mask",
    "token_level_rewards",
    "advantages",
    "returns",
    "teacher_logprobs",
)
FLOAT_ARRAYS = ("logprobs", "token_level_rewards", "advantages", "returns", "teacher_logprobs")


@dataclass(frozen=True)
class Limits:
    max_batch_experiences: int = 65536
    max_batch_bytes: int = 64 << 20
    # The model's vocabulary size (its config.json); a batch's own vocab_size may only narrow it. 0 = unknown.
    vocab_size: int = 0


def effective_vocab_size(declared: int, known: int) -> int:
    """The bound token ids must stay under: the smaller of the batch's `declared` and the model's `known`
    size, ignoring either when 0 (unknown); 0 when both are."""
    return min(declared, known) if declared and known else declared or known


def _first_non_finite(values: Sequence[float]) -> int:
    return next(i for i, v in enumerate(values) if not math.isfinite(v))


def _check_ids(values: Sequence[int], vocab_size: int, where: str) -> None:
    if not values:
        return
    ids = np.array(values, dtype=np.int64)  # one C-level copy; min/max over Python ints costs 4x more
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        i = next(i for i, v in enumerate(values) if v < 0)
        raise ValidationError(f"{where}[{i}]", f"token id {values[i]} < 0")
    if vocab_size and high >= vocab_size:
        i = next(i for i, v in enumerate(values) if v >= vocab_size)
        raise ValidationError(f"{where}[{i}]", f"token id {values[i]} >= vocab_size {vocab_size}")


def validate_experience(exp: experience_pb2.Experience, index: int, vocab_size: int) -> None:
    where = f"experiences[{index}]"
    tokens = exp.tokens
    n_tokens = len(tokens)
    if n_tokens == 0:
        raise ValidationError(f"{where}.tokens", "empty")
    if not 0 <= exp.prompt_length < n_tokens:
        raise ValidationError(
            f"{where}.prompt_length",
            f"{exp.prompt_length} out of range [0, {n_tokens}) for {n_tokens} tokens (need a response token)",
        )
    _check_ids(tokens, vocab_size, f"{where}.tokens")
    response = n_tokens - exp.prompt_length
    for name in RESPONSE_ARRAYS:
        length = len(getattr(exp, name))
        if length and length != response:
            raise ValidationError(f"{where}.{name}", f"length {length} != response length {response}")
    for name in FLOAT_ARRAYS:
        values = getattr(exp, name)
        if values and not math.isfinite(sum(values)):
            i = _first_non_finite(values)
            raise ValidationError(f"{where}.{name}[{i}]", f"not finite ({values[i]})")
    for scalar in ("reward", "reward_baseline"):
        if exp.HasField(scalar) and not math.isfinite(getattr(exp, scalar)):
            raise ValidationError(f"{where}.{scalar}", f"not finite ({getattr(exp, scalar)})")
    if exp.model_version < 0:
        raise ValidationError(f"{where}.model_version", f"{exp.model_version} < 0")
    if exp.use_count < 0:
        raise ValidationError(f"{where}.use_count", f"{exp.use_count} < 0")
    if exp.rejected_tokens:
        _check_ids(exp.rejected_tokens, vocab_size, f"{where}.rejected_tokens")
        if not 0 <= exp.rejected_prompt_length < len(exp.rejected_tokens):
            raise ValidationError(
                f"{where}.rejected_prompt_length",
                f"{exp.rejected_prompt_length} out of range [0, {len(exp.rejected_tokens)})",
            )


def validate_batch(batch: experience_pb2.ExperienceBatch, limits: Limits) -> None:
    """Raise `ValidationError` for the first problem found; return quietly when the batch is good."""
    count = len(batch.experiences)
    if count > limits.max_batch_experiences:
        raise ValidationError(
            "experiences", f"{count} experiences > max_batch_experiences {limits.max_batch_experiences}"
        )
    size = batch.ByteSize()
    if size > limits.max_batch_bytes:
        raise ValidationError("batch", f"{size} bytes > max_batch_bytes {limits.max_batch_bytes}")
    if batch.vocab_size < 0:
        raise ValidationError("vocab_size", f"{batch.vocab_size} < 0")
    vocab_size = effective_vocab_size(batch.vocab_size, limits.vocab_size)
    for i, exp in enumerate(batch.experiences):
        validate_experience(exp, i, vocab_size)
