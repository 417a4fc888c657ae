"""Log-probs and entropy from the decoder's hidden states, the LM head applied a chunk of tokens at a time.

The full-logits path keeps ``N x vocab`` logits, their fp32 copy and the log-softmax for the backward
pass: at a 151,936-token vocabulary and 16k tokens per micro-batch that is ~30 GiB, more than the
decoder's own activations.  Here the model runs without its LM head (`hidden_at_logits`: the decoder's
output is taken by a forward hook while the head computes no positions), the hidden states at the
logit positions are selected, and each chunk of `chunk_tokens` of them goes through the head, the fp32
cast, the temperature and `logprobs_and_entropy` inside `torch.utils.checkpoint`, so only one chunk's
logits exist at a time, in the forward and again in the backward, which recomputes them.  The numbers
are those of the full path (tests/unit/trainer/test_chunked_logprobs.py).

The root module still runs its own forward, so FSDP2's root hooks (all-gather of the embeddings, final
norm and LM head, which stay unsharded until the backward's end), peft's LoRA wrapper and HF's
gradient checkpointing see an ordinary call.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from services.trainer.algorithms import logprobs_and_entropy, logprobs_from_logits
from services.trainer.collate import Packed

__all__ = ["chunked_logprobs", "hidden_at_logits", "supports_hidden_path"]

# config attributes of models whose logits are more than lm_head(hidden): they keep the full path
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def supports_hidden_path(module: nn.Module) -> bool:
    """Whether the logits of `module` are exactly ``lm_head(decoder(x))`` (Llama, Qwen2 and kin)."""
    config = getattr(module, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return False
    try:
        return module.get_decoder() is not None and module.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return False


def hidden_at_logits(module: nn.Module, packed: Packed) -> torch.Tensor:
    """``(N, hidden)``: the decoder's final (normed) hidden states at the positions whose logits
    predict `packed.labels`; the LM head computes nothing (`logits_to_keep` is empty)."""
    captured: list[torch.Tensor] = []

    def keep(_module: nn.Module, _args: object, output: object) -> None:
        captured.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])  # type: ignore[index]

    none = torch.zeros(0, dtype=torch.long, device=packed.input_ids.device)
    handle = module.get_decoder().register_forward_hook(keep)
    try:
        if packed.packed:
            module(input_ids=packed.input_ids, position_ids=packed.position_ids, logits_to_keep=none,
                   use_cache=False)  # fmt: skip
        else:
            module(input_ids=packed.input_ids, attention_mask=packed.attention_mask, logits_to_keep=none,
                   use_cache=False)  # fmt: skip
    finally:
        handle.remove()
    (hidden,) = captured
    if packed.packed:
        return hidden[0, packed.logit_positions]
    return hidden[packed.logit_rows, packed.logit_positions]


def _chunk(
    head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    if not entropy:
        return logprobs_from_logits(logits, labels), labels.new_zeros(0, dtype=torch.float32)
    return logprobs_and_entropy(logits, labels, entropy_grad=entropy_grad)


def chunked_logprobs(
    module: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``(N,)`` of `labels` (and the entropy ``(N,)`` with `entropy`) under
    ``lm_head(hidden) / temperature``, `chunk_tokens` rows of `hidden` at a time; with gradients each
    chunk of several is checkpointed (its logits are recomputed in the backward pass, not kept)."""
    head = module.get_output_embeddings()
    # one chunk: checkpointing would only add a recomputation (its logits are the peak either way)
    grad = torch.is_grad_enabled() and hidden.shape[0] > chunk_tokens
    log_probs, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, y = hidden[start : start + chunk_tokens], labels[start : start + chunk_tokens]
        args = (head, h, y, temperature, entropy, entropy_grad)
        lp, ent = checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args)
        log_probs.append(lp)
        entropies.append(ent)
    if not log_probs:  # no response tokens
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if entropy else None
    return torch.cat(log_probs), torch.cat(entropies) if entropy else None
