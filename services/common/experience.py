"""The Experience record every service exchanges, and its exact codec to and from `rft.v1.Experience`.

An Experience is one sampled sequence (prompt + response) with what the trainer needs: the rollout
log-probs, the action mask (multi-turn observations masked out), the reward and the model version
that produced it (per token too, `token_model_versions`, when weights changed mid-response). It mirrors the proto field by field; arrays are torch tensors with fixed dtypes
(tokens int64, masks bool, float arrays float32) so a round trip through the proto is bit-exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, torch.as_tensor(value, dtype=torch.float32))
        if self.action_mask is not None:
            self.action_mask = torch.as_tensor(self.action_mask, dtype=torch.bool)
        if self.rejected_tokens is not None:
            self.rejected_tokens = torch.as_tensor(self.rejected_tokens, dtype=torch.int64)
        if self.token_model_versions is not None:
            self.token_model_versions = torch.as_tensor(self.token_model_versions, dtype=torch.int64)

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


_FLOAT_FIELDS = ("logprobs", "token_level_rewards", "advantages", "returns", "teacher_logprobs")


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
        eid=experience_pb2.ExperienceId(
            batch_id=exp.eid.batch_id,
            task_id=exp.eid.task_id,
            run_id=exp.eid.run_id,
            step=exp.eid.step,
            suffix=exp.eid.suffix,
            group_id=exp.eid.group_id,
            explorer_id=exp.eid.explorer_id,
        ),
        tokens=_int32_list(exp.tokens, "tokens"),
        prompt_length=exp.prompt_length,
        truncated=exp.truncated,
        model_version=exp.model_version,
        metrics=exp.metrics,
        info=exp.info,
        prompt_text=exp.prompt_text,
        response_text=exp.response_text,
        use_count=exp.use_count,
        rejected_prompt_length=exp.rejected_prompt_length,
    )
    if exp.reward is not None:
        msg.reward = exp.reward
    if exp.reward_baseline is not None:
        msg.reward_baseline = exp.reward_baseline
    for name in _FLOAT_FIELDS:
        value = getattr(exp, name)
        if value is not None:
            getattr(msg, name).extend(value.tolist())
    if exp.action_mask is not None:
        msg.action_mask.extend(exp.action_mask.tolist())
    if exp.rejected_tokens is not None:
        msg.rejected_tokens.extend(_int32_list(exp.rejected_tokens, "rejected_tokens"))
    if exp.token_model_versions is not None:
        msg.token_model_versions.extend(exp.token_model_versions.tolist())
    return msg


def _float_tensor(values: Sequence[float]) -> torch.Tensor | None:
    return torch.tensor(list(values), dtype=torch.float32) if len(values) else None


def from_proto(msg: experience_pb2.Experience) -> Experience:
    """Decode one Experience; empty optional arrays become None."""
    eid = msg.eid
    return Experience(
        tokens=torch.tensor(list(msg.tokens), dtype=torch.int64),
        prompt_length=msg.prompt_length,
        eid=ExperienceId(
            batch_id=eid.batch_id,
            task_id=eid.task_id,
            run_id=eid.run_id,
            step=eid.step,
            suffix=eid.suffix,
            group_id=eid.group_id,
            explorer_id=eid.explorer_id,
        ),
        logprobs=_float_tensor(msg.logprobs),
        action_mask=torch.tensor(list(msg.action_mask), dtype=torch.bool) if len(msg.action_mask) else None,
        reward=msg.reward if msg.HasField("reward") else None,
        token_level_rewards=_float_tensor(msg.token_level_rewards),
        truncated=msg.truncated,
        model_version=msg.model_version,
        metrics=dict(msg.metrics),
        info=dict(msg.info),
        prompt_text=msg.prompt_text,
        response_text=msg.response_text,
        advantages=_float_tensor(msg.advantages),
        returns=_float_tensor(msg.returns),
        teacher_logprobs=_float_tensor(msg.teacher_logprobs),
        use_count=msg.use_count,
        rejected_tokens=torch.tensor(list(msg.rejected_tokens), dtype=torch.int64)
        if len(msg.rejected_tokens)
        else None,
        rejected_prompt_length=msg.rejected_prompt_length,
        reward_baseline=msg.reward_baseline if msg.HasField("reward_baseline") else None,
        token_model_versions=torch.tensor(list(msg.token_model_versions), dtype=torch.int64)
        if len(msg.token_model_versions)
        else None,
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
