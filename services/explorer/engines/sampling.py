"""Vectorised per-row sampling: temperature, top-k, top-p, then a draw and its log-probability.

Every row of a batch may have its own arguments; they travel as tensors so a step costs a few tensor
ops whatever the batch holds. The returned log-probs are those of the distribution actually sampled
from (vLLM `processed_logprobs`): log_softmax(filter(logits / T)). Greedy rows (T = 0) take the argmax
and report its log-prob under log_softmax(filter(logits)). A repetition penalty, when a row has one,
is applied to the logits before all of that (`apply_repetition_penalty`, vLLM's order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.explorer.engines.base import SamplingParams


@dataclass
class RowParams:
    """Sampling arguments of B rows as tensors on the model's device. Shapes: (B,)."""

    temperature: torch.Tensor  # float32; 0 = greedy
    top_k: torch.Tensor  # int64; <= 0 = off
    top_p: torch.Tensor  # float32; 1 = off
    any_greedy: bool
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool

    @classmethod
    def build(cls, params: Sequence[SamplingParams], device: torch.device | str) -> RowParams:
        temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device)
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        greedy = [p.temperature == 0 for p in params]
        return cls(
            temperature=temp,
            top_k=top_k,
            top_p=top_p,
            any_greedy=any(greedy),
            all_greedy=all(greedy),
            any_top_k=any(p.top_k > 0 for p in params),
            any_top_p=any(p.top_p < 1 for p in params),
        )

    def select(self, keep: torch.Tensor) -> RowParams:
        """The rows at `keep` (a LongTensor of row indices)."""
        temp = self.temperature[keep]
        return RowParams(
            temperature=temp,
            top_k=self.top_k[keep],
            top_p=self.top_p[keep],
            any_greedy=self.any_greedy,
            all_greedy=self.all_greedy,
            any_top_k=self.any_top_k,
            any_top_p=self.any_top_p,
        )


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019, arXiv:1909.05858) as HF and vLLM apply it: the
    logit l of a token already in the row's prompt or sample becomes l / p when l > 0 and l x p
    otherwise. Shapes: logits (B, V), seen (B, V) bool, penalty (B,) float32 (1 = off)."""
    p = penalty.unsqueeze(-1).to(logits.dtype)
    penalised = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalised, logits)


def filtered_logprobs(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """log-probs (B, V) of the sampling distribution of each row (filtered entries are -inf)."""
    logits = logits.float()
    if not rows.all_greedy:
        temp = rows.temperature
        if rows.any_greedy:
            temp = torch.where(temp > 0, temp, torch.ones_like(temp))
        logits = logits / temp.unsqueeze(-1)
    if rows.any_top_k or rows.any_top_p:
        logits = _top_k_top_p(logits, rows)
    return torch.log_softmax(logits, dim=-1)


def _top_k_top_p(logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
    """Mask logits outside each row's top-k, then outside its top-p nucleus (vLLM order)."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    if rows.any_top_k:
        k = torch.where(rows.top_k > 0, rows.top_k.clamp(max=vocab), torch.full_like(rows.top_k, vocab))
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        sorted_logits = sorted_logits.masked_fill(ranks >= k.unsqueeze(-1), float("-inf"))
    if rows.any_top_p:
        probs = torch.softmax(sorted_logits, dim=-1)
        # mass strictly before each token; the first token is always kept
        before = torch.cumsum(probs, dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(before >= rows.top_p.unsqueeze(-1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sample(
    logits: torch.Tensor, rows: RowParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. Returns (tokens (B,) int64, their log-probs (B,) float32)."""
    tokens, lp, _ = sample_dist(logits, rows, generator)
    return tokens, lp


def sample_dist(
    logits: torch.Tensor, rows: RowParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As `sample`, plus the log-probs (B, V) of the distribution sampled from (for top log-probs)."""
    logprobs = filtered_logprobs(logits, rows)
    if rows.all_greedy:
        tokens = logprobs.argmax(dim=-1)
    else:
        tokens = _inverse_cdf(logprobs.exp(), generator)
        if rows.any_greedy:
            tokens = torch.where(rows.temperature > 0, tokens, logprobs.argmax(dim=-1))
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), logprobs


def _inverse_cdf(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row from `probs` ``(B, V)`` by inverting its CDF with one uniform per row.

    Exact like vLLM's exponential race (argmax p / E), but it needs B random numbers instead of B x V:
    on CPU, filling a (64, 512) tensor with exponentials takes ~0.8 ms, the CDF search ~0.05 ms.  A
    token with probability 0 (filtered by top-k/top-p) is never picked: the search returns the first
    index whose cumulative mass exceeds u, and such a token adds no mass."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    # u rounded up to the total mass (rare): the last token with mass instead of one past the end
    picked = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(picked > 0, tokens, probs.argmax(dim=-1))
