"""``TrainBatch``: the typed record of tensors the algorithm functions read and produce.

It replaces veRL's string-keyed ``DataProto`` inside the trainer: each field has a fixed meaning
and shape, checked when the record is built.  Tensor fields are ``(bs, response_length)`` unless
noted; ``None`` means "not computed (yet)".  The record is frozen: a stage that computes something
returns a new record with ``batch.replace(advantages=…)``; tensors are shared, not copied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["TrainBatch"]

_PER_TOKEN = (
    "responses",
    "token_level_scores",
    "token_level_rewards",
    "advantages",
    "returns",
    "values",
    "old_log_probs",
    "ref_log_probs",
    "rollout_log_probs",
    "rollout_is_weights",
    "rm_scores",
)
_PER_SAMPLE = ("uid", "data_sources", "ground_truths", "extra_infos")


@dataclasses.dataclass(frozen=True, eq=False)
class TrainBatch:
    """A batch of ``bs`` samples with responses padded to ``response_length``.

    Fields (all ``(bs, response_length)`` unless noted):

    - ``response_mask``: 1 for a response token the model produced (and is trained on), 0 for
      padding and tool/observation tokens.  Required.
    - ``responses``: response token ids (int64).
    - ``prompt_mask``: ``(bs, prompt_length)`` attention mask of the left-padded prompts.
    - ``token_level_scores``: the reward function's output, the score at the last response token.
    - ``token_level_rewards``: scores after reward shaping (KL penalty); what advantages read.
    - ``advantages``, ``returns``: estimator outputs.
    - ``values``: critic values of the rollout policy (PPO).
    - ``old_log_probs``, ``ref_log_probs``: log-probs of the response tokens under the policy that
      sampled them (recomputed by the trainer) and under the reference model.
    - ``rollout_log_probs``: the log-probs the rollout engine reported when it sampled (a check on
      the recomputation: ``training/rollout_probs_diff_*``).
    - ``rollout_is_weights``: rollout importance-sampling weights that multiply the per-token
      policy loss (``rollout_correction``; 0 at padding).
    - ``rm_scores``: precomputed reward-model scores; reward managers return them as they are.
    - ``reward_baselines``: ``(bs,)`` greedy-rollout rewards for ReMax.
    - ``uid``: ``bs`` group ids (str or int); samples of one prompt share a uid (a GRPO group).
    - ``data_sources``, ``ground_truths``, ``extra_infos``: ``bs`` per-sample reward inputs.
    """

    response_mask: torch.Tensor
    responses: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None
    token_level_scores: torch.Tensor | None = None
    token_level_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    values: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None
    rollout_is_weights: torch.Tensor | None = None
    rm_scores: torch.Tensor | None = None
    reward_baselines: torch.Tensor | None = None
    uid: Sequence[str | int] | None = None
    data_sources: Sequence[str] | None = None
    ground_truths: Sequence[Any] | None = None
    extra_infos: Sequence[dict[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        if self.response_mask.dim() != 2:
            raise ValueError(
                f"response_mask must be (bs, response_length), got shape {tuple(self.response_mask.shape)}"
            )
        shape = tuple(self.response_mask.shape)
        for name in _PER_TOKEN:
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(
                    f"{name} has shape {tuple(value.shape)}, expected {shape} like response_mask"
                )
        if self.prompt_mask is not None and (
            self.prompt_mask.dim() != 2 or self.prompt_mask.shape[0] != shape[0]
        ):
            raise ValueError(
                f"prompt_mask has shape {tuple(self.prompt_mask.shape)}, expected ({shape[0]}, prompt_length)"
            )
        if self.reward_baselines is not None and tuple(self.reward_baselines.shape) != (shape[0],):
            raise ValueError(
                f"reward_baselines has shape {tuple(self.reward_baselines.shape)}, expected ({shape[0]},)"
            )
        for name in _PER_SAMPLE:
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, str) or len(value) != shape[0]:
                    raise ValueError(f"{name} must be a sequence of {shape[0]} items (one per sample)")
                object.__setattr__(self, name, tuple(value))

    @property
    def batch_size(self) -> int:
        """Number of samples ``bs``."""
        return int(self.response_mask.shape[0])

    @property
    def response_length(self) -> int:
        """Padded response length."""
        return int(self.response_mask.shape[1])

    def replace(self, **changes: Any) -> TrainBatch:
        """A new batch with some fields replaced (shapes are checked again)."""
        return dataclasses.replace(self, **changes)

    def require(self, name: str) -> Any:
        """The field ``name``, or a ``ValueError`` saying that a step needs it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"TrainBatch.{name} is required here but is None")
        return value
