"""`load_weights`: copy received tensors into a live `torch.nn.Module`, in place.

Every method ends here on the receiving side (the hf rollout engine calls it directly; a vLLM worker
extension may use its own loader). In place means the module's parameters keep their identity,
device and dtype (values are cast to the module's dtype), so optimizers, compiled graphs or engine
caches that hold them stay valid. Tied weights: `named_parameters(remove_duplicate=False)` lists
every name of a shared parameter (the tiny Qwen2's `lm_head.weight` is `model.embed_tokens.weight`),
so a state dict with both names or only one of them loads, and the tie is kept. Non-persistent
buffers (rotary `inv_freq`) are never required.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from services.weight_sync.errors import WeightSyncError


class WeightLoadError(WeightSyncError, KeyError):
    """Unknown, missing or mis-shaped tensors; the message names them."""

    def __str__(self) -> str:
        return str(self.args[0])


def _targets(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], list[set[str]]]:
    """Name -> tensor for every parameter and persistent buffer, and groups of names sharing one."""
    targets: dict[str, torch.Tensor] = {}
    persistent = set(model.state_dict(keep_vars=True))
    for name, p in model.named_parameters(remove_duplicate=False):
        targets[name] = p
    for name, b in model.named_buffers(remove_duplicate=False):
        if name in persistent:
            targets[name] = b
    groups: dict[int, set[str]] = {}
    for name, t in targets.items():
        groups.setdefault(id(t), set()).add(name)
    return targets, list(groups.values())


@torch.no_grad()
def load_weights(
    model: torch.nn.Module,
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    *,
    strict: bool = True,
) -> list[str]:
    """Copy `named_tensors` into `model` in place; returns the names loaded, in arrival order.

    An unknown name or a shape mismatch raises `WeightLoadError` before that tensor is copied (a
    stream may already have loaded earlier ones). With `strict`, every parameter/persistent buffer
    must be covered (one name of a tied group suffices), checked after the stream ends. When both
    names of a tied pair arrive, both are copied into the one shared tensor (the last one wins).
    """
    targets, groups = _targets(model)
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    loaded: list[str] = []
    for name, tensor in items:
        target = targets.get(name)
        if target is None:
            raise WeightLoadError(
                f"unknown tensor {name!r}: the model has no parameter or buffer of that name"
            )
        if tuple(target.shape) != tuple(tensor.shape):
            raise WeightLoadError(
                f"tensor {name!r}: shape {list(tensor.shape)} != model's {list(target.shape)}"
            )
        target.copy_(tensor)
        loaded.append(name)
    if strict:
        got = set(loaded)
        missing = sorted(min(g) for g in groups if not g & got)
        if missing:
            shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise WeightLoadError(
                f"{len(missing)} model tensor(s) missing from the received weights: {shown}"
            )
    return loaded
