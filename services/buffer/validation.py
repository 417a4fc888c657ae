"""Validation of incoming `ExperienceBatch`es: a bad batch is refused whole, naming the field and index.

Checks, per experience i (R = response length = len(tokens) - prompt_length):
- `tokens` non-empty, ids >= 0 and < the vocabulary size; same for `rejected_tokens`. The vocabulary
  size is the model's (`Limits.vocab_size`, read from the model folder's config.json at buffer start);
  a batch's own `vocab_size` may narrow it, never widen it; with neither, ids are only checked >= 0;
- 0 <= `prompt_length` < len(tokens) (at least one response token);
- `logprobs`, `action_mask`, `token_level_rewards`, `advantages`, `returns`, `teacher_logprobs`,
  `token_model_versions` are empty or of length R;
- `reward`, `reward_baseline` and every float array finite; `model_version`, `use_count` and every
  `token_model_versions` entry >= 0;
and per batch: at most `max_batch_experiences` experiences and `max_batch_bytes` serialized bytes.

No tensors are built. A well-formed batch, the common case, passes on a fast path: from the bytes as
received (`wire_check.batch_ok`) when the servicer kept them, else one pass over the parsed message
(`_batch_ok`) that checks lengths and scalars per experience and gathers the token and float arrays into
two numpy arrays; either way the id range and finiteness are one reduction each for the whole batch.
Only when the fast path declines does the per-experience check (`validate_experience`) run, in order, to
name the first offending field and index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rft.v1 import experience_pb2

from services.buffer import wire_check
from services.buffer.records import ValidationError

RESPONSE_ARRAYS = (
    "logprobs",
    "action_mask",
    "token_level_rewards",
    "advantages",
    "returns",
    "teacher_logprobs",
    "token_model_versions",
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


def _check_versions(values: Sequence[int], where: str) -> None:
    if values and min(values) < 0:
        i = next(i for i, v in enumerate(values) if v < 0)
        raise ValidationError(f"{where}[{i}]", f"model version {values[i]} < 0")


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
    _check_versions(exp.token_model_versions, f"{where}.token_model_versions")
    if exp.rejected_tokens:
        _check_ids(exp.rejected_tokens, vocab_size, f"{where}.rejected_tokens")
        if not 0 <= exp.rejected_prompt_length < len(exp.rejected_tokens):
            raise ValidationError(
                f"{where}.rejected_prompt_length",
                f"{exp.rejected_prompt_length} out of range [0, {len(exp.rejected_tokens)})",
            )


def _batch_ok(experiences: Sequence[experience_pb2.Experience], vocab_size: int) -> bool:
    """True when every experience passes `validate_experience`; False when any may not (then the
    per-experience check finds and names the first problem)."""
    token_arrays, float_arrays = [], []
    for exp in experiences:
        tokens = exp.tokens
        n_tokens = len(tokens)
        prompt_length = exp.prompt_length
        if not 0 <= prompt_length < n_tokens or exp.model_version < 0 or exp.use_count < 0:
            return False
        response = n_tokens - prompt_length
        for name in RESPONSE_ARRAYS:
            length = len(getattr(exp, name))
            if length and length != response:
                return False
        for name in FLOAT_ARRAYS:
            values = getattr(exp, name)
            if values:
                float_arrays.append(np.array(values, dtype=np.float64))
        for scalar in ("reward", "reward_baseline"):
            if exp.HasField(scalar) and not math.isfinite(getattr(exp, scalar)):
                return False
        versions = exp.token_model_versions
        if versions and min(versions) < 0:
            return False
        token_arrays.append(np.array(tokens, dtype=np.int64))
        rejected = exp.rejected_tokens
        if rejected:
            if not 0 <= exp.rejected_prompt_length < len(rejected):
                return False
            token_arrays.append(np.array(rejected, dtype=np.int64))
    if token_arrays:
        ids = np.concatenate(token_arrays)
        if ids.min() < 0 or (vocab_size and ids.max() >= vocab_size):
            return False
    return not float_arrays or bool(np.isfinite(np.concatenate(float_arrays)).all())


def validate_batch(
    batch: experience_pb2.ExperienceBatch,
    limits: Limits,
    wire_bytes: int | None = None,
    members: Sequence[bytes] | None = None,
) -> None:
    """Raise `ValidationError` for the first problem found; return quietly when the batch is good.

    When the batch was received as bytes, `wire_bytes` is its size and `members` each experience's bytes
    (see `WireBatch`): a good batch is then recognised from the bytes (`wire_check`)."""
    count = len(batch.experiences)
    if count > limits.max_batch_experiences:
        raise ValidationError(
            "experiences", f"{count} experiences > max_batch_experiences {limits.max_batch_experiences}"
        )
    size = batch.ByteSize() if wire_bytes is None else wire_bytes
    if size > limits.max_batch_bytes:
        raise ValidationError("batch", f"{size} bytes > max_batch_bytes {limits.max_batch_bytes}")
    if batch.vocab_size < 0:
        raise ValidationError("vocab_size", f"{batch.vocab_size} < 0")
    vocab_size = effective_vocab_size(batch.vocab_size, limits.vocab_size)
    if members is not None and wire_check.batch_ok(members, vocab_size):
        return
    if _batch_ok(batch.experiences, vocab_size):
        return
    for i, exp in enumerate(batch.experiences):
        validate_experience(exp, i, vocab_size)
