"""From leased `Experience`s to tensors: the per-response `TrainBatch` and packed model inputs.

A `StepBatch` keeps each sequence unpadded (prompt + response token ids) next to the `TrainBatch`
of response-aligned tensors ``(bs, response_length)`` that the algorithm functions read.  For a
forward pass the rows of a micro-batch are *packed*: concatenated into one ``(1, T)`` row whose
`position_ids` restart at 0 for every sequence.  transformers builds a block-diagonal causal mask
from such position ids (no attention across sequences), so no compute is spent on padding, and
`logits_to_keep` limits the LM head to the positions that predict response tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from services.common.experience import Experience
from services.trainer.algorithms import TrainBatch

__all__ = ["Packed", "StepBatch", "collate", "pack", "select_rows"]


def select_rows(batch: TrainBatch, index: Sequence[int]) -> TrainBatch:
    """The rows `index` of every field of `batch` (tensors indexed, per-sample tuples picked)."""
    idx = torch.as_tensor(list(index), dtype=torch.long)
    changes = {}
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        if isinstance(value, torch.Tensor):
            changes[field.name] = value.index_select(0, idx)
        elif isinstance(value, tuple):
            changes[field.name] = tuple(value[i] for i in index)
    return dataclasses.replace(batch, **changes)


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """`bs` unpadded sequences and their `TrainBatch`.

    `tokens[i]` is ``(prompt_lengths[i] + response_lengths[i],)`` int64; `batch` tensors are
    ``(bs, response_length)`` with response_length = max response length of the batch.
    """

    tokens: tuple[torch.Tensor, ...]
    prompt_lengths: tuple[int, ...]
    batch: TrainBatch

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def response_lengths(self) -> tuple[int, ...]:
        return tuple(int(t.numel()) - p for t, p in zip(self.tokens, self.prompt_lengths, strict=True))

    @property
    def seq_lengths(self) -> tuple[int, ...]:
        return tuple(int(t.numel()) for t in self.tokens)

    @property
    def num_tokens(self) -> int:
        return sum(self.seq_lengths)

    def rows(self, index: Sequence[int]) -> StepBatch:
        return StepBatch(
            tokens=tuple(self.tokens[i] for i in index),
            prompt_lengths=tuple(self.prompt_lengths[i] for i in index),
            batch=select_rows(self.batch, index),
        )

    def with_batch(self, batch: TrainBatch) -> StepBatch:
        return dataclasses.replace(self, batch=batch)


def collate(experiences: Sequence[Experience], pad_token_id: int = 0) -> StepBatch:
    """Build a `StepBatch` from experiences.

    response_mask = action_mask (all ones when absent); token_level_scores = the experience's
    token_level_rewards when given, else its scalar reward at the last masked response token;
    uid = the GRPO group id; advantages/returns are carried over when the explorer set them, and the
    rollout's log-probs (as rollout_log_probs) when every experience has them.
    """
    if not experiences:
        raise ValueError("cannot collate an empty batch")
    bs = len(experiences)
    resp_lens = [e.response_length for e in experiences]
    prompt_lens = [e.prompt_length for e in experiences]
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens, strict=True)):
        if p < 1 or r < 0:
            raise ValueError(f"experience {i}: prompt_length {p} must be >= 1 and response length >= 0")
    r_max, p_max = max(max(resp_lens), 1), max(prompt_lens)
    responses = torch.full((bs, r_max), pad_token_id, dtype=torch.long)
    mask = torch.zeros(bs, r_max)
    prompt_mask = torch.zeros(bs, p_max)
    scores = torch.zeros(bs, r_max)
    carried = {name: torch.zeros(bs, r_max) for name in ("advantages", "returns", "logprobs")}
    has = dict.fromkeys(carried, True)
    for i, exp in enumerate(experiences):
        r = resp_lens[i]
        responses[i, :r] = exp.response_tokens
        mask[i, :r] = 1.0 if exp.action_mask is None else exp.action_mask.float()
        prompt_mask[i, p_max - prompt_lens[i] :] = 1.0
        if exp.token_level_rewards is not None:
            scores[i, :r] = exp.token_level_rewards
        elif exp.reward is not None and r > 0:
            masked = torch.nonzero(mask[i, :r]).flatten()
            last = int(masked[-1]) if masked.numel() else r - 1
            scores[i, last] = float(exp.reward)
        for name in carried:
            value = getattr(exp, name)
            if value is None:
                has[name] = False
            else:
                carried[name][i, :r] = value
    batch = TrainBatch(
        response_mask=mask,
        responses=responses,
        prompt_mask=prompt_mask,
        token_level_scores=scores,
        token_level_rewards=scores,
        advantages=carried["advantages"] if has["advantages"] else None,
        returns=carried["returns"] if has["returns"] else None,
        rollout_log_probs=carried["logprobs"] if has["logprobs"] else None,
        uid=[e.eid.group_id or e.eid.uid for e in experiences],
    )
    return StepBatch(
        tokens=tuple(e.tokens for e in experiences), prompt_lengths=tuple(prompt_lens), batch=batch
    )


@dataclasses.dataclass(frozen=True)
class Packed:
    """One packed micro-batch.

    input_ids, position_ids: ``(1, T)``; logit_positions, labels, rows, cols: ``(N,)`` — position
    ``logit_positions[k]`` predicts `labels[k]`, which is response token ``cols[k]`` of row ``rows[k]``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    logit_positions: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    shape: tuple[int, int]  # (bs, response_length) of the padded outputs

    def to(self, device: torch.device) -> Packed:
        return dataclasses.replace(
            self, **{f: getattr(self, f).to(device) for f in ("input_ids", "position_ids", "logit_positions")}
        )

    def unpack(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Scatter per-response-token `values` ``(N,)`` into a padded ``(bs, response_length)`` tensor."""
        out = values.new_full(self.shape, fill)
        return out.index_put((self.rows.to(values.device), self.cols.to(values.device)), values)


def pack(step: StepBatch) -> Packed:
    """Pack the rows of `step` into one sequence (see the module docstring)."""
    ids, pos, logit_pos, labels, rows, cols = [], [], [], [], [], []
    start = 0
    for i, (tokens, p) in enumerate(zip(step.tokens, step.prompt_lengths, strict=True)):
        n = int(tokens.numel())
        r = n - p
        ids.append(tokens)
        pos.append(torch.arange(n))
        logit_pos.append(torch.arange(start + p - 1, start + n - 1))
        labels.append(tokens[p:])
        rows.append(torch.full((r,), i, dtype=torch.long))
        cols.append(torch.arange(r))
        start += n
    return Packed(
        input_ids=torch.cat(ids).unsqueeze(0),
        position_ids=torch.cat(pos).unsqueeze(0),
        logit_positions=torch.cat(logit_pos),
        labels=torch.cat(labels),
        rows=torch.cat(rows),
        cols=torch.cat(cols),
        shape=(step.size, step.batch.response_length),
    )
