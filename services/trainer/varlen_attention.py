"""Varlen attention for packed rows where no flash-attention kernel is installed (CPU, most sdpa setups).

The trainer packs a micro-batch into one ``(1, T)`` row whose `position_ids` restart at 0 for every
sequence (`collate.pack`).  transformers' sdpa path turns that into a dense ``T x T`` block-diagonal
mask, so attention costs grow with the square of the whole micro-batch, not of each sequence.
This attention function (registered with transformers' `AttentionInterface` as `NAME`) instead
scatters q, k and v into right-padded ``(sequences, heads, longest, dim)`` tensors, runs
`scaled_dot_product_attention` with ``is_causal`` (a causal mask never lets a real token see the
padding that follows it, so no mask tensor is needed) and gathers the outputs back into the packed
order.  The linear layers still see only the T real tokens.  Registering the name also means
transformers builds no mask for it (it is not in `ALL_MASK_ATTENTION_FUNCTIONS`).

`enable(module)` switches a transformers model to it when the model's attention is sdpa or eager.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface

__all__ = ["NAME", "enable", "segments", "varlen_sdpa_attention"]

NAME = "rft_varlen_sdpa"


@dataclass(frozen=True)
class Bucket:
    """Sequences of similar length, padded to the longest of them: `tokens` are their packed
    positions ``(n,)`` and `slots` where each lands in a ``(count x longest)`` layout."""

    tokens: torch.Tensor
    slots: torch.Tensor
    count: int
    longest: int


def segments(position_ids: torch.Tensor, smallest: int = 8) -> list[Bucket]:
    """Buckets of the sequences of packed `position_ids` ``(1, T)`` (0, 1, .., n0-1, 0, 1, .., n1-1,
    ...), grouped by length rounded up to a power of two (at least `smallest`), so padding within a
    bucket is under 2x and a few long sequences do not pad all the short ones."""
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0).flatten()
    lengths = torch.diff(starts, append=starts.new_tensor([pos.numel()]))
    seq_of_token = torch.repeat_interleave(torch.arange(starts.numel(), device=pos.device), lengths)
    caps = torch.clamp(lengths, min=smallest)
    caps = (2 ** torch.ceil(torch.log2(caps.double()))).long()
    buckets = []
    for cap in torch.unique(caps).tolist():
        members = torch.nonzero(caps == cap).flatten()
        local = torch.full((starts.numel(),), -1, dtype=torch.long, device=pos.device)
        local[members] = torch.arange(members.numel(), device=pos.device)
        row = local[seq_of_token]
        tokens = torch.nonzero(row >= 0).flatten()
        longest = int(lengths[members].max())
        buckets.append(Bucket(tokens, row[tokens] * longest + pos[tokens], int(members.numel()), longest))
    return buckets


_last: tuple[torch.Tensor, list[Bucket]] | None = None


def _segments_cached(position_ids: torch.Tensor) -> list[Bucket]:
    """`segments`, computed once per forward pass (every layer gets the same position_ids tensor)."""
    global _last
    if _last is None or _last[0] is not position_ids:
        _last = (position_ids, segments(position_ids))
    return _last[1]


def varlen_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature; query ``(1, H, T, D)``, key/value ``(1, Hkv, T, D)``.
    Returns ``(1, T, H, D)``."""
    if position_ids is None or query.shape[0] != 1:
        raise ValueError(
            f"{NAME} attention needs one packed row and its position_ids "
            f"(got batch {query.shape[0]}, position_ids {'missing' if position_ids is None else 'given'})"
        )
    out = query.new_zeros(query.shape[1], query.shape[2], query.shape[3])  # (H, T, D)
    for bucket in _segments_cached(position_ids):

        def padded(
            x: torch.Tensor, b: Bucket = bucket
        ) -> torch.Tensor:  # (1, h, T, D) -> (count, h, longest, D)
            heads, dim = x.shape[1], x.shape[3]
            rows = x[0].index_select(1, b.tokens)
            grid = x.new_zeros(heads, b.count * b.longest, dim).index_copy(1, b.slots, rows)
            return grid.view(heads, b.count, b.longest, dim).transpose(0, 1)

        q, k, v = padded(query), padded(key), padded(value)
        if q.device.type == "cpu":
            o = _math_attention(q, k, v, dropout, scaling)
        else:
            o = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout, scale=scaling, enable_gqa=q.shape[1] != k.shape[1]
            )
        heads, dim = o.shape[1], o.shape[3]
        o = o.transpose(0, 1).reshape(heads, bucket.count * bucket.longest, dim).index_select(1, bucket.slots)
        out = out.index_copy(1, bucket.tokens, o)
    return out.transpose(0, 1).unsqueeze(0), None


def _math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, scaling: float | None
) -> torch.Tensor:
    """Causal attention as three tensor ops: for short rows on CPU this is several times faster than
    the blocked flash kernel sdpa picks there, whose per-block costs dominate small problems."""
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves several query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    length = q.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
    future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    if dropout:
        probs = F.dropout(probs, p=dropout)
    return torch.matmul(probs, v)


AttentionInterface.register(NAME, varlen_sdpa_attention)


def enable(module: nn.Module) -> bool:
    """Use `NAME` for `module` (a transformers model) when its attention is sdpa or eager; True if so.
    Flash-attention models keep their own varlen kernel."""
    config = getattr(module, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    module.set_attn_implementation(NAME)
    return True
