"""vLLM worker extension for weight updates (`worker_extension_cls`), after vLLM's RLHF examples.

vLLM mixes this class into every GPU worker; the engine reaches its methods with `collective_rpc`, whose
arguments travel as msgspec msgpack and so are plain values only (bytes, str, int, lists): the group's
rendezvous as protobuf bytes, a version, or a `SharedWeights` payload naming a shared-memory safetensors
file (weights_shm.py). Each worker joins the weight-sync broadcast group as rank `rank_offset + worker
rank` (the trainer's rank 0 sends) and receives every tensor in full, or reads them from the file.

A load goes through vLLM's in-place reload (`Worker.reload_weights` -> `reload/inplace.py`): layerwise
reload around the model's own `load_weights`, so each layer's `process_weights_after_loading` (fp8 /
quantized repacking, MoE layouts, the CPU backend's packed GEMM weights) runs again, as in vLLM's own
weight-transfer engines. A subset (`strict` False: the merged layers of a LoRA run) is completed with the
rest of the model folder's weights (a LoRA run's frozen base) and reloaded whole: a fused layer loaded in
part would be rebuilt with its other part uninitialised, and the CPU backend keeps no plain weight to
load a part into. A quantized model takes no subset (its folder is in another format than the merged
layers). A tied layer (the output layer holding the input embedding's weight) gets no weights of its
own in a reload, so it is tied and processed again after it (`reprocess_tied`).
No vLLM import here, so the module loads anywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from services.explorer.engines.weights_shm import SharedWeights, read_shared_weights
from services.weight_sync import WeightLoadError
from services.weight_sync.member.call_off_file import CallOffFile


class QuantizedPartialLoadError(RuntimeError):
    """A subset of the weights cannot be completed from a quantized model's folder (another format)."""


class WeightSyncExtension:
    """Methods added to each vLLM worker (`self.device`, `self.rank`, `self.model_runner`,
    `self.model_config` and `reload_weights` come from it)."""

    _rft_group: Any = None

    def rft_join_group(
        self, info_bytes: bytes, rank_offset: int, call_off_path: str = "", token: int = 0
    ) -> int:
        """Join as `rank_offset + worker rank`; given up once the engine calls `token` off in the
        file at `call_off_path` (the join was superseded)."""
        from rft.v1 import common_pb2

        from services.weight_sync import BroadcastGroup, GroupInfo

        info = GroupInfo.from_proto(common_pb2.WeightSyncGroupInfo.FromString(info_bytes))
        rank = rank_offset + int(self.rank)  # type: ignore[attr-defined]
        device = self.device  # type: ignore[attr-defined]
        with _watching(call_off_path, token, lambda: None) as abandon:
            self._rft_group = BroadcastGroup.join(info, rank, device=device, abandon=abandon)
        return rank

    def rft_receive(self, version: int, call_off_path: str = "", token: int = 0) -> int:
        """Receive and load the next broadcast; given up (`StaleGenerationError`) once the engine calls
        `token` off in the file at `call_off_path` (the synchronizer called the broadcast off)."""
        if self._rft_group is None:
            raise RuntimeError("rft_receive before rft_join_group")
        group = self._rft_group
        with _watching(call_off_path, token, group.abandon):
            return self._rft_load(group.receive(version), strict=True)

    def rft_load_shared(self, payload: SharedWeights) -> int:
        device = self.device  # type: ignore[attr-defined]
        return self._rft_load(read_shared_weights(payload, device), strict=bool(payload["strict"]))

    def rft_leave(self) -> None:
        if self._rft_group is not None:
            self._rft_group.close()
            self._rft_group = None

    def _rft_load(self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool) -> int:
        """Load `weights`; returns how many tensors were given."""
        counted = _Counted(weights)
        whole: Iterable[tuple[str, torch.Tensor]] = counted
        if not strict:
            self._rft_require_unquantized()
            whole = with_folder_rest(counted, self.model_config.model, self.device)  # type: ignore[attr-defined]
        tied = tied_layers(self.model_runner.model)  # type: ignore[attr-defined]
        # vLLM's post-load processing included (layerwise reload, checkpoint format)
        self.reload_weights(weights_iterator=whole, is_checkpoint_format=True)  # type: ignore[attr-defined]
        reprocess_tied(tied)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return counted.n

    def _rft_require_unquantized(self) -> None:
        quantization = self.model_config.quantization  # type: ignore[attr-defined]
        if quantization is not None:
            raise QuantizedPartialLoadError(
                f"the rollout model is quantized ({quantization}); a subset of its weights (e.g. merged "
                "LoRA layers) cannot be completed from its model folder (stored in the quantized format): sync the full state "
                "dict (a method other than lora_adapter) or use an unquantized model"
            )


def _watching(path: str, token: int, on_set: Any) -> contextlib.AbstractContextManager[Any]:
    """The call-off file's watch for `token`, or nothing to watch (no file named: an abandon of None)."""
    if not path:
        return contextlib.nullcontext(None)
    return CallOffFile(path).watching(token, on_set)


def with_folder_rest(
    given: Iterable[tuple[str, torch.Tensor]], folder: str, device: Any
) -> Iterator[tuple[str, torch.Tensor]]:
    """`given`, then every other tensor of the model folder's safetensors files, read onto `device`.
    A folder without them is refused here, before the reload has taken anything."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{folder} has no *.safetensors files to complete a partial load from")
    return _given_then_rest(given, files, device)


def _given_then_rest(
    given: Iterable[tuple[str, torch.Tensor]], files: list[Path], device: Any
) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    seen = set()
    for name, t in given:
        seen.add(name)
        yield name, t
    for path in files:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                if name not in seen:
                    yield name, f.get_tensor(name)


def tied_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    """(layer, owner) for every layer whose weight is another layer's (tied embeddings: the output
    layer holds the input embedding's weight), the owner first in module order."""
    owners: dict[int, torch.nn.Module] = {}
    pairs = []
    for module in model.modules():
        w = module._parameters.get("weight")
        if w is None:
            continue
        owner = owners.setdefault(id(w), module)
        if owner is not module:
            pairs.append((module, owner))
    return pairs


def reprocess_tied(pairs: list[tuple[torch.nn.Module, torch.nn.Module]]) -> None:
    """After a layerwise reload: a tied layer got no weights of its own, so vLLM put its old kernel
    tensors back and did not run its post-load processing, and a backend that keeps a processed copy
    (the CPU backend packs the output layer's weight for its GEMM) would go on with the old weights.
    Tie it to its owner's weight again and process it as a load does."""
    for layer, owner in pairs:
        layer.weight = owner.weight
        method = getattr(layer, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(layer)


class _Counted:
    """An iterable that counts what passes through it."""

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]):
        self._items, self.n = items, 0

    def __iter__(self):
        for item in self._items:
            self.n += 1
            yield item
