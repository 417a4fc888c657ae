"""The Experience record every service exchanges, and its exact codec to and from `rft.v1.Experience`.

An Experience is one sampled sequence (prompt + response) with what the trainer needs: the rollout
log-probs, the action mask (multi-turn observations masked out), the reward and the model version
that produced it (per token too, `token_model_versions`, when weights changed mid-response). It mirrors the proto field by field; arrays are torch tensors with fixed dtypes
(tokens int64, masks bool, float arrays float32) so a round trip through the proto is bit-exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

import torch
from rft.v1 import experience_pb2

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class ExperienceId:
    """Identity of an experience; `group_id` ties the `repeat_times` samples of one task (a GRPO group)."""

    batch_id: str = ""
    task_id: str = ""
    run_id: int = 0
    step: int = 0
    suffix: str = ""
    group_id: str = ""
    explorer_id: str = ""

    @property
    def uid(self) -> str:
        """Unique id of this sample: group + run + suffix."""
        return f"{self.explorer_id}/{self.group_id}/{self.run_id}/{self.suffix}"


@dataclass
class Experience:
    """One sampled sequence. Shapes: tokens (P + R,), response arrays (R,), where P = prompt_length."""

    tokens: torch.Tensor  # (P + R,) int64
    prompt_length: int
    eid: ExperienceId = field(default_factory=ExperienceId)
    logprobs: torch.Tensor | None = None  # (R,) float32, under the sampling distribution
    action_mask: torch.Tensor | None = None  # (R,) bool, True for tokens the model generated
    reward: float | None = None
    token_level_rewards: torch.Tensor | None = None  # (R,) float32
    truncated: bool = False
    model_version: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    prompt_text: str = ""
    response_text: str = ""
    advantages: torch.Tensor | None = None  # (R,) float32
    returns: torch.Tensor | None = None  # (R,) float32
    teacher_logprobs: torch.Tensor | None = None  # (R,) float32
    use_count: int = 0
    rejected_tokens: torch.Tensor | None = None  # (P + R',) int64, DPO pairs only
    rejected_prompt_length: int = 0
    reward_baseline: float | None = None  # ReMax: reward of a greedy response to the same prompt
    # (R,) int64: per response token, the weights' version that sampled it (None: all model_version)
    token_model_versions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.int64)
        for name, dtype in _ARRAYS.items():
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, torch.as_tensor(value, dtype=dtype))

    @property
    def response_length(self) -> int:
        return int(self.tokens.numel()) - self.prompt_length

    @property
    def prompt_tokens(self) -> torch.Tensor:
        return self.tokens[: self.prompt_length]

    @property
    def response_tokens(self) -> torch.Tensor:
        return self.tokens[self.prompt_length :]

    @property
    def group_id(self) -> str:
        return self.eid.group_id

    def versions_per_token(self) -> torch.Tensor:
        """(R,) int64: `token_model_versions`, or `model_version` for every response token."""
        if self.token_model_versions is not None:
            return self.token_model_versions
        return torch.full((self.response_length,), self.model_version, dtype=torch.int64)


# How each field crosses the proto (besides `tokens`, always there, and `eid`, field by field):
# as it is; a map (a dict on the way back); an `optional` float (unset: None); an array with its tensor
# dtype (empty: None). `test_experience_codec` checks that these cover every field.
_ID_FIELDS = tuple(f.name for f in fields(ExperienceId))
_PLAIN = (
    "prompt_length",
    "truncated",
    "model_version",
    "prompt_text",
    "response_text",
    "use_count",
    "rejected_prompt_length",
)
_MAPS = ("metrics", "info")
_OPTIONAL_FLOATS = ("reward", "reward_baseline")
_ARRAYS = {
    "logprobs": torch.float32,
    "action_mask": torch.bool,
    "token_level_rewards": torch.float32,
    "advantages": torch.float32,
    "returns": torch.float32,
    "teacher_logprobs": torch.float32,
    "rejected_tokens": torch.int64,  # int32 in the proto, checked on the way there
    "token_model_versions": torch.int64,
}


class ExperienceCodecError(ValueError):
    """An Experience cannot be encoded (value out of the proto's range)."""


def _int32_list(tensor: torch.Tensor, name: str) -> list[int]:
    values = tensor.tolist()
    if values and (min(values) < -(2**31) or max(values) > INT32_MAX):
        raise ExperienceCodecError(f"{name}: values must fit in int32")
    return values


def to_proto(exp: Experience) -> experience_pb2.Experience:
    """Encode one Experience exactly (floats are float32 on both sides)."""
    msg = experience_pb2.Experience(
        eid=experience_pb2.ExperienceId(**{name: getattr(exp.eid, name) for name in _ID_FIELDS}),
        tokens=_int32_list(exp.tokens, "tokens"),
        **{name: getattr(exp, name) for name in (*_PLAIN, *_MAPS)},
    )
    for name in _OPTIONAL_FLOATS:
        value = getattr(exp, name)
        if value is not None:
            setattr(msg, name, value)
    for name in _ARRAYS:
        value = getattr(exp, name)
        if value is not None:
            getattr(msg, name).extend(
                _int32_list(value, name) if name == "rejected_tokens" else value.tolist()
            )
    return msg


def _tensor(values: Sequence[float | int | bool], dtype: torch.dtype) -> torch.Tensor | None:
    return torch.tensor(list(values), dtype=dtype) if len(values) else None


def from_proto(msg: experience_pb2.Experience) -> Experience:
    """Decode one Experience; empty optional arrays become None."""
    return Experience(
        tokens=torch.tensor(list(msg.tokens), dtype=torch.int64),
        eid=ExperienceId(**{name: getattr(msg.eid, name) for name in _ID_FIELDS}),
        **{name: getattr(msg, name) for name in _PLAIN},
        **{name: dict(getattr(msg, name)) for name in _MAPS},
        **{name: getattr(msg, name) if msg.HasField(name) else None for name in _OPTIONAL_FLOATS},
        **{name: _tensor(getattr(msg, name), dtype) for name, dtype in _ARRAYS.items()},
    )


def batch_to_proto(
    experiences: Iterable[Experience], vocab_size: int = 0, producer_id: str = ""
) -> experience_pb2.ExperienceBatch:
    return experience_pb2.ExperienceBatch(
        experiences=[to_proto(e) for e in experiences], vocab_size=vocab_size, producer_id=producer_id
    )


def batch_from_proto(msg: experience_pb2.ExperienceBatch) -> list[Experience]:
    return [from_proto(m) for m in msg.experiences]


def experiences_equal(a: Experience, b: Experience) -> bool:
    """Exact equality (bitwise for tensors, NaN-aware for scalar floats)."""
    for name in Experience.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if x is None or y is None or x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not torch.equal(
                x.view(torch.int32) if x.dtype == torch.float32 else x,
                y.view(torch.int32) if y.dtype == torch.float32 else y,
            ):
                return False
        elif isinstance(x, float) and isinstance(y, float):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
        elif isinstance(x, dict):
            if x.keys() != y.keys() or any(
                not (x[k] == y[k] or (isinstance(x[k], float) and math.isnan(x[k]) and math.isnan(y[k])))
                for k in x
            ):
                return False
        elif x != y:
            return False
    return True
