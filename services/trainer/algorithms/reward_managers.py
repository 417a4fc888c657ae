"""Reward managers: turn decoded responses into ``token_level_scores``.

A manager decodes each valid response, scores it, and writes the scalar at the sample's last
valid response token (index Σ_t response_mask − 1); every other position is 0.  An empty
response has no such token and gets an all-zero row.  Precomputed ``rm_scores`` on the batch are
returned as they are (veRL behaviour).  ``NaiveRewardManager`` is veRL's ``naive``;
``DAPORewardManager`` adds the overlong-buffer penalty of DAPO (https://arxiv.org/abs/2503.14476).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from services.common.rewards import default_compute_score

from .batch import TrainBatch
from .params import FrozenParams
from .registries import REWARD_MANAGERS, get_scorer

__all__ = [
    "DAPORewardManager",
    "NaiveRewardManager",
    "OverlongBufferConfig",
    "RewardResult",
    "Tokenizer",
    "make_compute_score",
]

logger = logging.getLogger(__name__)

ComputeScore = Callable[[str, str, Any, Any], "float | dict[str, Any]"]


class Tokenizer(Protocol):
    """What a reward manager needs from a tokenizer (a HF tokenizer satisfies it)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class RewardResult:
    """``reward_tensor`` ``(bs, response_length)``; ``reward_extra_info``: name -> ``bs`` values."""

    reward_tensor: torch.Tensor
    reward_extra_info: Mapping[str, list[Any]] = field(default_factory=dict)


def make_compute_score(scorer: str | ComputeScore | None, **scorer_args: Any) -> ComputeScore:
    """A veRL-style ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

    ``None``: dispatch on ``data_source`` (``default_compute_score``); a string: that registered
    scorer or ``pkg.mod:fn`` plug-in for every sample, called with ``scorer_args``; a callable is
    used as it is.
    """
    if scorer is None:
        if scorer_args:
            raise ValueError("scorer_args need a named scorer")
        return default_compute_score
    if callable(scorer):
        if scorer_args:
            raise ValueError("scorer_args only apply to a named scorer")
        return scorer
    fn = get_scorer(scorer)

    def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None):
        return fn(solution_str, ground_truth, extra_info, **scorer_args)

    return compute_score


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager:
    """Score each sample with ``compute_score`` and place it at the last valid token.

    ``num_examine`` samples per data source are logged (decoded text, ground truth, score).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        num_examine: int = 0,
        compute_score: str | ComputeScore | None = None,
        reward_fn_key: str = "data_source",
        scorer_args: Mapping[str, Any] | None = None,
    ) -> None:
        if reward_fn_key != "data_source":
            raise ValueError("reward_fn_key: only 'data_source' exists on TrainBatch")
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = make_compute_score(compute_score, **dict(scorer_args or {}))

    def decode(self, token_ids: list[int]) -> str:
        """Text of the valid response tokens."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def shape(self, score: float, response_length: int, extra: dict[str, list[Any]]) -> float:
        """Reward from score; the naive manager leaves it unchanged."""
        del response_length, extra
        return score

    def shape_scores(self, batch: TrainBatch) -> tuple[RewardResult, dict[str, float]]:
        """Shape the scores already on ``batch`` (``token_level_scores``: the explorer's workflow
        rewards) and return them with the manager's metrics.

        Each row's score Σ_t scores goes through ``shape``; the change is added at the row's last
        valid response token (rows with no valid token are left as they are).
        """
        scores = batch.require("token_level_scores")
        lengths = batch.response_mask.sum(dim=-1).long().tolist()
        reward = scores.clone()
        extra: dict[str, list[Any]] = defaultdict(list)
        deltas = []
        for i, length in enumerate(lengths):
            score = float(scores[i].sum())
            delta = self.shape(score, length, extra) - score
            deltas.append(delta)
            if length > 0 and delta:
                last = int(batch.response_mask[i].nonzero()[-1])
                reward[i, last] += delta
        return RewardResult(reward, dict(extra)), self.shaping_metrics(deltas)

    def shaping_metrics(self, deltas: list[float]) -> dict[str, float]:
        """Metrics of what ``shape`` changed (the naive manager changes nothing)."""
        del deltas
        return {}

    def __call__(self, batch: TrainBatch) -> RewardResult:
        """Scores for every sample of ``batch`` (needs responses, data_sources, ground_truths)."""
        if batch.rm_scores is not None:
            return RewardResult(batch.rm_scores)
        responses = batch.require("responses")
        sources = batch.require("data_sources")
        truths = batch.require("ground_truths")
        infos = batch.extra_infos or (None,) * batch.batch_size
        lengths = batch.response_mask.sum(dim=-1).long().tolist()
        reward = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        extra: dict[str, list[Any]] = defaultdict(list)
        shown: dict[str, int] = defaultdict(int)
        for i, length in enumerate(lengths):
            valid_ids = responses[i][batch.response_mask[i].bool()].tolist()
            text = self.decode(valid_ids)
            result = self.compute_score(sources[i], text, truths[i], infos[i])
            if isinstance(result, Mapping):
                if "score" not in result:
                    raise ValueError(f"compute_score returned a dict without 'score': {sorted(result)}")
                score = float(result["score"])
                for key, value in result.items():
                    extra[key].append(value)
            else:
                score = float(result)
                extra["acc"].append(score)
            value = self.shape(score, length, extra)
            if length > 0:
                last = int(batch.response_mask[i].nonzero()[-1])
                reward[i, last] = value
            if shown[sources[i]] < self.num_examine:
                shown[sources[i]] += 1
                logger.info("[%s] response=%r ground_truth=%r score=%s", sources[i], text, truths[i], value)
        return RewardResult(reward.to(batch.response_mask.device), dict(extra))


@dataclass(frozen=True)
class OverlongBufferConfig(FrozenParams):
    """DAPO soft overlong punishment: off by default; the paper uses a 4096-token buffer and
    factor 1.0.  ``log`` records ``overlong_reward``/``overlong`` per sample."""

    enable: bool = False
    len: int = 4096
    penalty_factor: float = 1.0
    log: bool = False

    def __post_init__(self) -> None:
        if self.len <= 0:
            raise ValueError(f"overlong_buffer.len must be > 0, got {self.len}")


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """Naive manager plus a trailing-EOS strip and DAPO's overlong reward shaping ("soft overlong
    punishment", Yu et al. 2025, https://arxiv.org/abs/2503.14476, eq. 13).

    With L the response length, L_max = ``max_resp_len`` and B the buffer length (L_cache):
    reward = score + min(−(L − (L_max − B)) / B · penalty_factor, 0), i.e. 0 up to L_max − B,
    falling linearly to −penalty_factor at L_max and staying there beyond it (the paper's −1; veRL
    leaves it unbounded, the same for every response the rollout's L_max cap allows).  In a run the trainer applies it to the explorer's rewards
    (``shape_scores``) before advantages.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        num_examine: int = 0,
        compute_score: str | ComputeScore | None = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: OverlongBufferConfig | Mapping[str, Any] | None = None,
        scorer_args: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, scorer_args)
        self.overlong = OverlongBufferConfig.coerce(overlong_buffer_cfg)
        if self.overlong.enable and max_resp_len is None:
            raise ValueError("max_resp_len must be set when the overlong buffer is enabled")
        if self.overlong.enable and max_resp_len is not None and max_resp_len < self.overlong.len:
            raise ValueError(
                f"max_resp_len ({max_resp_len}) must be >= overlong buffer len ({self.overlong.len})"
            )
        self.max_resp_len = max_resp_len
        self.eos_token: str | None = getattr(tokenizer, "eos_token", None)

    def decode(self, token_ids: list[int]) -> str:
        """Text of the valid tokens minus one trailing EOS string (for tokenizers whose EOS is
        not a special token)."""
        text = super().decode(token_ids)
        if self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text

    def shaping_metrics(self, deltas: list[float]) -> dict[str, float]:
        """``reward/overlong_penalty_mean`` (mean penalty over the batch) and ``reward/overlong_ratio``
        (fraction of responses penalised), when the overlong buffer is enabled."""
        if not self.overlong.enable:
            return {}
        n = max(len(deltas), 1)
        return {
            "reward/overlong_penalty_mean": sum(deltas) / n,
            "reward/overlong_ratio": sum(d < 0 for d in deltas) / n,
        }

    def shape(self, score: float, response_length: int, extra: dict[str, list[Any]]) -> float:
        """Score plus the overlong penalty (when enabled)."""
        if not self.overlong.enable:
            return score
        assert self.max_resp_len is not None
        expected = self.max_resp_len - self.overlong.len
        factor = self.overlong.penalty_factor
        penalty = max(min(-(response_length - expected) / self.overlong.len * factor, 0.0), -factor)
        if self.overlong.log:
            extra["overlong_reward"].append(penalty)
            extra["overlong"].append(penalty < 0)
        return score + penalty
