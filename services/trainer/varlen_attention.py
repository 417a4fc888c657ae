"""Varlen attention for packed rows where no flash-attention kernel is installed (CPU, most sdpa setups).

The trainer packs a micro-batch into one ``(1, T)`` row whose `position_ids` restart at 0 for every
sequence (`collate.pack`).  transformers' sdpa path turns that into a dense ``T x T`` block-diagonal
mask, so attention costs grow with the square of the whole micro-batch, not of each sequence.
This attention function (registered with transformers' `AttentionInterface` as `NAME`) instead
scatters q, k and v into right-padded ``(sequences, heads, longest, dim)`` tensors, runs
`scaled_dot_product_attention` with ``is_causal`` (a causal mask never lets a real token see the
padding that follows it, so no mask tensor is needed) and gathers the outputs back into the packed
order.  The linear layers still see only the T real tokens.  Rows that share a prompt can be packed
as one prompt followed by their responses (`collate.pack(share_prompts=True)`): `segments` reads
that layout from the position ids and masks attention so each response sees only the prompt and
itself, so the prompt is computed once per group instead of once per sample.  Registering the name also means
transformers builds no mask for it (it is not in `ALL_MASK_ATTENTION_FUNCTIONS`).

`enable(module)` switches a transformers model to it when the model's attention is sdpa or eager;
`load_packed_model(path, dtype)` loads a model for the trainer (policy, reference, critic body) with it,
or (`meta=True`) builds the weightless skeleton of one for sharded loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM, GenerationConfig

from services.common.model_folder import local_folder
from services.common.modeling import load_model, resolve_dtype
from services.trainer.fsdp import meta_parameters

__all__ = ["NAME", "enable", "load_packed_model", "segments", "varlen_sdpa_attention"]

NAME = "rft_varlen_sdpa"


@dataclass(frozen=True)
class Bucket:
    """Packed sequences (or prompt groups) of similar length, padded to the longest: `tokens` are
    their packed positions ``(n,)``, `slots` where each lands in a ``(count x longest)`` grid, and
    `mask` ``(count, 1, longest, longest)`` the keys each query may see (None: plain causal)."""

    tokens: torch.Tensor
    slots: torch.Tensor
    count: int
    longest: int
    mask: torch.Tensor | None = None


def segments(position_ids: torch.Tensor, smallest: int = 8) -> list[Bucket]:
    """Buckets of the segments of packed `position_ids` ``(1, T)``.

    A segment starts where the position is 0.  Plain packing gives one sequence per segment
    (0, 1, .., n-1).  Shared-prompt packing (`collate.pack(share_prompts=True)`) gives one prompt
    followed by several responses that all continue it: 0..P-1, P..P+r1-1, P..P+r2-1, ...; a
    position that does not grow starts the next response.  There a query sees the prompt's keys and
    the earlier keys of its own response, never another response's.  Segments are grouped by length
    rounded up to a power of two (at least `smallest`), so padding within a bucket is under 2x.
    """
    pos = position_ids.reshape(-1)
    n = pos.numel()
    device = pos.device
    index = torch.arange(n, device=device)
    seg_start = pos == 0
    new_response = torch.zeros(n, dtype=torch.bool, device=device)
    new_response[1:] = (pos[1:] <= pos[:-1]) & ~seg_start[1:]
    seg = torch.cumsum(seg_start.long(), 0) - 1
    starts = torch.nonzero(seg_start).flatten()
    count_all = int(starts.numel())
    lengths = torch.diff(starts, append=starts.new_tensor([n]))
    offset = index - starts[seg]
    response = torch.cumsum((new_response | seg_start).long(), 0) - 1  # one id per prompt-or-response run
    # the prompt length of a shared segment: where its later responses restart (none: no sharing)
    prompt_len = torch.full((count_all,), n + 1, dtype=torch.long, device=device)
    prompt_len.scatter_reduce_(0, seg[new_response], pos[new_response], "amin")
    shared_key = pos < prompt_len[seg]
    shares = torch.zeros(count_all, dtype=torch.bool, device=device)
    shares[seg[new_response]] = True
    caps = torch.clamp(lengths, min=smallest)
    caps = (2 ** torch.ceil(torch.log2(caps.double()))).long()
    buckets = []
    for cap in torch.unique(caps).tolist():
        members = torch.nonzero(caps == cap).flatten()
        local = torch.full((count_all,), -1, dtype=torch.long, device=device)
        local[members] = torch.arange(members.numel(), device=device)
        row = local[seg]
        tokens = torch.nonzero(row >= 0).flatten()
        longest, count = int(lengths[members].max()), int(members.numel())
        slots = row[tokens] * longest + offset[tokens]
        mask = None
        if bool(shares[members].any()):
            run = torch.full((count * longest,), -1, dtype=torch.long, device=device)
            run[slots] = response[tokens]
            shared = torch.zeros(count * longest, dtype=torch.bool, device=device)
            shared[slots] = shared_key[tokens]
            run, shared = run.view(count, 1, longest), shared.view(count, 1, longest)
            causal = torch.ones(longest, longest, dtype=torch.bool, device=device).tril()
            diagonal = torch.eye(longest, dtype=torch.bool, device=device)
            # (count, 1, q, k): a key is visible when not in the future and shared or of the same run;
            # every query sees itself, so padding queries never have an empty row
            mask = (causal & (shared | (run == run.transpose(1, 2)))) | diagonal
            mask = mask.unsqueeze(1)
        buckets.append(Bucket(tokens, slots, count, longest, mask))
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
            o = _math_attention(q, k, v, dropout, scaling, bucket.mask)
        else:
            o = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=bucket.mask,
                is_causal=bucket.mask is None,
                dropout_p=dropout,
                scale=scaling,
                enable_gqa=q.shape[1] != k.shape[1],
            )
        heads, dim = o.shape[1], o.shape[3]
        o = o.transpose(0, 1).reshape(heads, bucket.count * bucket.longest, dim).index_select(1, bucket.slots)
        out = out.index_copy(1, bucket.tokens, o)
    return out.transpose(0, 1).unsqueeze(0), None


def _math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout: float,
    scaling: float | None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention as three tensor ops, causal or under `mask` (True = visible): for short rows on CPU
    this is several times faster than the blocked flash kernel sdpa picks there, whose per-block
    costs dominate small problems."""
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves several query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    length = q.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
    hidden = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1) if mask is None else ~mask
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
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


def load_packed_model(path: str, dtype: str = "float32", *, meta: bool = False) -> nn.Module:
    """`modeling.load_model`, with this attention where it applies: every model the trainer runs on
    packed rows is loaded here.

    `meta`: the same model built from the folder's config with its parameters on the meta device
    (`fsdp.meta_parameters`; no weights read, no memory), the skeleton that sharded loading fills."""
    if not meta:
        model = load_model(path, dtype=dtype)
    else:
        folder = local_folder(path)
        with meta_parameters():
            model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(folder), dtype=resolve_dtype(dtype)
            )
        if (Path(folder) / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(folder)
    enable(model)
    return model
