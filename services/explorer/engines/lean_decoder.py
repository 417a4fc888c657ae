"""A lean forward pass over a transformers Llama-family decoder (Qwen2, Llama, Mistral) for sampling.

The `hf` engine's sampling loop calls the model once per new token.  For small models and for the
last few rows of a batch (the long answers everyone waits for) that call is mostly Python: module
dispatch, mask construction, cache bookkeeping.  `LeanDecoder` computes the same thing from the same
parameter tensors (it holds the modules, so in-place weight loads apply at once) with plain tensor
ops and its own preallocated KV cache:

    x = embed(ids); per layer: x += o(attn(rope(q(n1 x)), rope(k(n1 x)), v(n1 x))); x += down(silu(gate(n2 x)) * up(n2 x))
    logits = lm_head(norm(x[:, -1]))

Attention uses `scaled_dot_product_attention` with a boolean mask: a key is visible when it is a real
token (left padding is not) and not in the query's future; every query also sees itself, so a
padding query never has an empty row (its output is unused).  Only the default RoPE and full
attention are supported; `unsupported(model)` says why a model is not, and the engine then keeps the
transformers forward.  Log-probs match the transformers forward within float error (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["KVCache", "LeanDecoder", "unsupported"]

SUPPORTED_TYPES = ("qwen2", "llama", "mistral")


def unsupported(model: nn.Module) -> str | None:
    """Why `model` cannot use `LeanDecoder` (None when it can)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED_TYPES}"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope type {rope.get('rope_type')!r} (only the default RoPE)"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (only silu)"
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if base is None or layers is None or not hasattr(model, "lm_head") or not hasattr(base, "rotary_emb"):
        return "not the usual <Model>ForCausalLM layout"
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if (
            attn is None
            or mlp is None
            or any(
                not isinstance(getattr(attn, n, None), nn.Linear)
                for n in ("q_proj", "k_proj", "v_proj", "o_proj")
            )
        ):
            return "a layer without q/k/v/o projections"
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            return "query/key norms"
        if any(
            not isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")
        ):
            return "a layer without a gated MLP"
    return None


@dataclass
class KVCache:
    """Per layer (keys, values) ``(B, Hkv, capacity, D)``; positions ``[0, length)`` are filled."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (a LongTensor), in that order."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]


class LeanDecoder:
    """The forward pass of a supported model (see the module docstring); inference only."""

    def __init__(self, model: nn.Module):
        reason = unsupported(model)
        if reason:
            raise ValueError(f"LeanDecoder does not support this model: {reason}")
        config = model.config
        self.model = model
        self.base = model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.scaling = self.head_dim**-0.5

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        weight = self.base.embed_tokens.weight
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        n = len(self.base.layers)
        return KVCache(
            [weight.new_empty(shape) for _ in range(n)], [weight.new_empty(shape) for _ in range(n)]
        )

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # transformers' RMSNorm: in float32, then back to the input dtype, then the weight
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rotary = self.base.rotary_emb
        freqs = positions[..., None].float() * rotary.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        return (emb.cos() * scale).to(dtype).unsqueeze(1), (emb.sin() * scale).to(dtype).unsqueeze(1)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    @torch.inference_mode()
    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Logits ``(B, vocab)`` of the last of the `S` new tokens ``ids`` ``(B, S)``.

        `positions` ``(B, S)`` are their RoPE positions, `key_mask` ``(B, length + S)`` is True for
        real tokens (False for left padding) over the cache and the new tokens; the new keys and
        values are written to `cache` at ``[length, length + S)`` and `length` advances.
        """
        batch, new = ids.shape
        start, end = cache.length, cache.length + new
        x = F.embedding(ids, self.base.embed_tokens.weight)
        cos, sin = self._rope(positions, x.dtype)
        visible = key_mask[:, None, None, :end]  # (B, 1, 1, end)
        if new > 1:  # no key in a query's future; each query sees itself
            q_pos = torch.arange(start, end, device=ids.device)[:, None]
            k_pos = torch.arange(end, device=ids.device)[None, :]
            visible = (visible & (k_pos <= q_pos)) | (k_pos == q_pos)
        for i, layer in enumerate(self.base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = self._norm(x, layer.input_layernorm.weight)
            q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(batch, new, self.heads, self.head_dim)
            k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(
                batch, new, self.kv_heads, self.head_dim
            )
            v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(
                batch, new, self.kv_heads, self.head_dim
            )
            q = self._rotate(q.transpose(1, 2), cos, sin)
            cache.keys[i][:, :, start:end] = self._rotate(k.transpose(1, 2), cos, sin)
            cache.values[i][:, :, start:end] = v.transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q,
                cache.keys[i][:, :, :end],
                cache.values[i][:, :, :end],
                attn_mask=visible,
                scale=self.scaling,
                enable_gqa=self.heads != self.kv_heads,
            )
            out = out.transpose(1, 2).reshape(batch, new, self.heads * self.head_dim)
            x = x + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            h = self._norm(x, layer.post_attention_layernorm.weight)
            gated = F.silu(F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias))
            x = x + F.linear(
                gated * F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias),
                mlp.down_proj.weight,
                mlp.down_proj.bias,
            )
        cache.length = end
        last = self._norm(x[:, -1], self.base.norm.weight)
        head = self.model.lm_head
        return F.linear(last, head.weight, getattr(head, "bias", None))
