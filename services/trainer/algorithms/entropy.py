"""Token entropy and log-probabilities from logits.

The actor reports the policy entropy (``actor/entropy``) and may add −entropy_coeff·H to the loss.
Logits must already be divided by the rollout temperature (veRL divides them in place before
both log-softmax and entropy), so the entropy is that of the distribution that was sampled.
"""

from __future__ import annotations

import torch

__all__ = [
    "compute_entropy_from_logits",
    "entropy_from_logits_chunked",
    "logprobs_and_entropy",
    "logprobs_from_logits",
]


def compute_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) − Σ_v softmax(z)_v·z_v over the last (vocabulary) dimension.

    Shapes: logits ``(bs, response_length, vocab_size)`` -> ``(bs, response_length)``.
    Computed in float32 at least (bf16 softmax sums are too coarse).
    """
    z = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    pd = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (pd * z).sum(dim=-1)


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """Same as ``compute_entropy_from_logits`` on ``(n_tokens, vocab_size)`` rows, ``chunk_size``
    rows at a time, so the float32 softmax of a large vocabulary never exists for all rows at once.
    Shapes: ``(..., vocab_size)`` -> ``(...)``.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(
        flat.shape[0], dtype=torch.float32 if flat.dtype != torch.float64 else flat.dtype, device=flat.device
    )
    for start in range(0, flat.shape[0], chunk_size):
        out[start : start + chunk_size] = compute_entropy_from_logits(flat[start : start + chunk_size])
    return out.reshape(logits.shape[:-1])


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(z)[label] per position.

    Shapes: logits ``(bs, response_length, vocab_size)``, labels ``(bs, response_length)`` (int64)
    -> ``(bs, response_length)``.
    """
    z = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    picked = torch.gather(z, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def logprobs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logprobs_from_logits`` and ``compute_entropy_from_logits`` sharing one logsumexp.

    With lse = logsumexp(z):  log π(label) = z[label] − lse;  H = lse − Σ_v exp(z_v − lse)·z_v.
    Unless ``entropy_grad``, H is computed under no_grad (a metric only: no autograd graph and no
    saved ``(N, vocab)`` softmax); the log-probs keep their gradient either way.
    Shapes: logits ``(..., vocab_size)``, labels ``(...)`` (int64) -> two ``(...)`` tensors.
    """
    z = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    lse = torch.logsumexp(z, dim=-1)
    log_probs = torch.gather(z, -1, labels.unsqueeze(-1)).squeeze(-1) - lse
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        p = torch.exp(z - lse.unsqueeze(-1))
        entropy = lse - (p * z).sum(dim=-1)
    return log_probs, entropy
