"""From leased `Experience`s to tensors: the per-response `TrainBatch` and packed model inputs.

A `StepBatch` keeps each sequence unpadded (prompt + response token ids) next to the `TrainBatch`
of response-aligned tensors ``(bs, response_length)`` that the algorithm functions read.  For a
forward pass the rows of a micro-batch are either

- *packed* (`pack`): concatenated into one ``(1, T)`` row whose `position_ids` restart at 0 for every
  sequence.  transformers builds a block-diagonal causal mask from such position ids (no attention
  across sequences), so no compute is spent on padding, and `logits_to_keep` limits the LM head to
  the positions that predict response tokens; or
- *padded* (`pad`): right-padded ``(bs, L)`` rows with an attention mask.

With a varlen attention kernel (flash-attention, or `varlen_attention`, which the trainer uses
otherwise) packing costs nothing extra.  With a dense kernel
(sdpa, eager: the CPU case) the packed row's mask is ``T x T``, so attention work grows with the
square of the whole micro-batch; for many short rows that costs more than the padding it saves.
`model_inputs` estimates both layouts' FLOPs (`layout_flops`) and takes the cheaper one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from services.common.experience import Experience
from services.trainer.algorithms import TrainBatch
from services.trainer.varlen_attention import NAME as VARLEN_ATTENTION

__all__ = [
    "ModelShape",
    "Packed",
    "StepBatch",
    "check_pairs",
    "collate",
    "expand_pairs",
    "layout_flops",
    "model_inputs",
    "pack",
    "pad",
    "select_rows",
]


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
    rollout's log-probs (as rollout_log_probs) and ReMax's greedy rewards (as reward_baselines, ``(bs,)``)
    when every experience has them. A DPO pair experience
    (with `rejected_tokens`) becomes two adjacent rows, chosen then rejected, sharing its group id.
    """
    if not experiences:
        raise ValueError("cannot collate an empty batch")
    experiences = expand_pairs(experiences)
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
        reward_baselines=torch.tensor([float(e.reward_baseline or 0.0) for e in experiences])
        if all(e.reward_baseline is not None for e in experiences)
        else None,
    )
    return StepBatch(
        tokens=tuple(e.tokens for e in experiences), prompt_lengths=tuple(prompt_lens), batch=batch
    )


def expand_pairs(experiences: Sequence[Experience]) -> list[Experience]:
    """Each pair experience as two rows (chosen: its `tokens`; rejected: `rejected_tokens`), others
    as they are. The rows carry no rollout log-probs: offline pairs were never sampled."""
    if all(e.rejected_tokens is None for e in experiences):
        return list(experiences)
    out: list[Experience] = []
    for exp in experiences:
        if exp.rejected_tokens is None:
            out.append(exp)
            continue
        for tokens, prompt_length in (
            (exp.tokens, exp.prompt_length),
            (exp.rejected_tokens, exp.rejected_prompt_length),
        ):
            out.append(Experience(tokens=tokens, prompt_length=prompt_length, eid=exp.eid,
                                  reward=exp.reward, model_version=exp.model_version))  # fmt: skip
    return out


def check_pairs(step: StepBatch) -> None:
    """Raise unless the rows are (chosen, rejected) pairs: an even count, each pair one group."""
    uid = step.batch.uid or ()
    if step.size % 2 or list(uid[0::2]) != list(uid[1::2]):
        raise ValueError(
            "a pairwise loss (dpo) needs (chosen, rejected) pair experiences; this batch has single "
            "rows. Put pairs in with `mode: train` and buffer.trainer_input.experience_buffer.path rows "
            "holding the format's chosen_key and rejected_key"
        )


@dataclasses.dataclass(frozen=True)
class Packed:
    """One micro-batch as model inputs, packed (`pack`) or padded (`pad`).

    Packed: input_ids, position_ids ``(1, T)``, attention_mask None.  Padded: input_ids,
    attention_mask ``(bs, L)``, position_ids None (0.. in every row).  logit_rows, logit_positions,
    labels, rows, cols: ``(N,)`` — the logits at ``[logit_rows[k], logit_positions[k]]`` predict
    `labels[k]`, which is response token ``cols[k]`` of row ``rows[k]`` (logit_rows is all 0 when packed).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor | None
    logit_positions: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    shape: tuple[int, int]  # (bs, response_length) of the padded outputs
    attention_mask: torch.Tensor | None = None
    logit_rows: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        return self.attention_mask is None

    def to(self, device: torch.device) -> Packed:
        moved = ("input_ids", "position_ids", "logit_positions", "attention_mask", "logit_rows")
        return dataclasses.replace(
            self, **{f: getattr(self, f).to(device) for f in moved if getattr(self, f) is not None}
        )

    def select_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``(N, vocab)`` logits of the response tokens from the model's output logits: ``(1, N, V)``
        when packed (computed at `logit_positions` only), ``(bs, L, V)`` when padded."""
        if self.packed:
            return logits[0]
        assert self.logit_rows is not None
        return logits[self.logit_rows, self.logit_positions]

    def unpack(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Scatter per-response-token `values` ``(N,)`` into a padded ``(bs, response_length)`` tensor."""
        out = values.new_full(self.shape, fill)
        return out.index_put((self.rows.to(values.device), self.cols.to(values.device)), values)


def pack(step: StepBatch, share_prompts: bool = False) -> Packed:
    """Pack the rows of `step` into one sequence (see the module docstring).

    With `share_prompts`, rows with identical prompt tokens (a GRPO group) become one segment: the
    prompt once, then each row's response, every response positioned right after the prompt.  Only
    for attention that reads this layout (`varlen_attention`); the LM head then reads the prompt's
    last position once per row of the group.
    """
    if share_prompts:
        return _pack_shared(step)
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


def _pack_shared(step: StepBatch) -> Packed:
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (tokens, p) in enumerate(zip(step.tokens, step.prompt_lengths, strict=True)):
        groups.setdefault(tuple(tokens[:p].tolist()), []).append(i)
    ids, pos, logit_pos, labels, rows, cols = [], [], [], [], [], []
    start = 0
    for prompt, members in groups.items():
        p = len(prompt)
        ids.append(torch.tensor(prompt, dtype=torch.long))
        pos.append(torch.arange(p))
        last_prompt = start + p - 1
        start += p
        for i in members:
            response = step.tokens[i][p:]
            r = int(response.numel())
            if r == 0:
                continue
            ids.append(response)
            pos.append(torch.arange(p, p + r))
            logit_pos.append(torch.cat([torch.tensor([last_prompt]), torch.arange(start, start + r - 1)]))
            labels.append(response)
            rows.append(torch.full((r,), i, dtype=torch.long))
            cols.append(torch.arange(r))
            start += r
    empty = torch.zeros(0, dtype=torch.long)
    return Packed(
        input_ids=torch.cat(ids).unsqueeze(0),
        position_ids=torch.cat(pos).unsqueeze(0),
        logit_positions=torch.cat(logit_pos) if logit_pos else empty,
        labels=torch.cat(labels) if labels else empty,
        rows=torch.cat(rows) if rows else empty,
        cols=torch.cat(cols) if cols else empty,
        shape=(step.size, step.batch.response_length),
    )


def pad(step: StepBatch, pad_token_id: int = 0) -> Packed:
    """The rows of `step` right-padded to the longest (see the module docstring)."""
    lengths = step.seq_lengths
    width = max(lengths)
    ids = torch.full((step.size, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((step.size, width), dtype=torch.long)
    logit_rows, logit_pos, labels, cols = [], [], [], []
    for i, (tokens, p) in enumerate(zip(step.tokens, step.prompt_lengths, strict=True)):
        n = int(tokens.numel())
        ids[i, :n] = tokens
        mask[i, :n] = 1
        logit_rows.append(torch.full((n - p,), i, dtype=torch.long))
        logit_pos.append(torch.arange(p - 1, n - 1))
        labels.append(tokens[p:])
        cols.append(torch.arange(n - p))
    rows = torch.cat(logit_rows)
    return Packed(
        input_ids=ids,
        position_ids=None,
        logit_positions=torch.cat(logit_pos),
        labels=torch.cat(labels),
        rows=rows,
        cols=torch.cat(cols),
        shape=(step.size, step.batch.response_length),
        attention_mask=mask,
        logit_rows=rows,
    )


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the layout estimate needs to know of a decoder: FLOPs per token of its linear layers,
    per attended (query, key) pair, and per LM-head position; whether its attention is varlen."""

    token_flops: float
    pair_flops: float
    head_flops: float
    varlen_attention: bool
    shared_prompts: bool = False  # the attention reads shared-prompt packing (`varlen_attention`)

    @classmethod
    def of(cls, module: torch.nn.Module) -> ModelShape:
        config = getattr(module, "config", None)
        h = int(getattr(config, "hidden_size", 0) or 0)
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        attn = str(getattr(config, "_attn_implementation", "") or "")
        params = sum(p.numel() for p in module.parameters())
        linear = max(params - 2 * vocab * h, params // 2)  # without the embedding and LM head
        return cls(
            token_flops=2.0 * linear,
            pair_flops=4.0 * h * layers,
            head_flops=2.0 * h * vocab,
            varlen_attention=attn.startswith("flash") or attn == VARLEN_ATTENTION,
            shared_prompts=attn == VARLEN_ATTENTION,
        )


def layout_flops(step: StepBatch, shape: ModelShape) -> tuple[float, float]:
    """Estimated forward FLOPs of (packed, padded) for the rows of `step`."""
    lengths = step.seq_lengths
    total, width, bs = sum(lengths), max(lengths), step.size
    response = sum(step.response_lengths)
    pairs_packed = sum(n * n for n in lengths) if shape.varlen_attention else total * total
    packed = total * shape.token_flops + pairs_packed * shape.pair_flops + response * shape.head_flops
    padded = bs * width * (shape.token_flops + shape.head_flops) + bs * width * width * shape.pair_flops
    return packed, padded


def model_inputs(step: StepBatch, shape: ModelShape, pad_token_id: int = 0) -> Packed:
    """The cheaper layout of `step` for a model of `shape` (ties go to packing); packed with shared
    prompts when the model's attention reads that layout (never more tokens than plain packing)."""
    if shape.shared_prompts:
        return pack(step, share_prompts=True)
    packed, padded = layout_flops(step, shape)
    return pad(step, pad_token_id) if padded < packed else pack(step)
