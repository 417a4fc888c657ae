"""vLLM worker extension for weight updates (`worker_extension_cls`), after vLLM's RLHF examples.

vLLM mixes this class into every GPU worker; the engine reaches its methods with `collective_rpc`, whose
arguments travel as msgspec msgpack and so are plain values only (bytes, str, int, lists): the group's
rendezvous as protobuf bytes, a version, or a `SharedWeights` payload naming a shared-memory safetensors
file (weights_shm.py). Each worker joins the weight-sync broadcast group as rank `rank_offset + worker
rank` (the trainer's rank 0 sends) and receives every tensor in full, or reads them from the file.

A full state dict loads through vLLM's in-place reload (`Worker.reload_weights` ->
`GPUModelRunner.reload_weights` -> `model_executor/model_loader/reload/inplace.py`): layerwise reload
around the model's own `load_weights`, so each layer's `process_weights_after_loading` (fp8 / quantized
repacking, MoE layouts) runs again, as in vLLM's own weight-transfer engines (`start_weight_update` /
`finish_weight_update` in `distributed/weight_transfer/nccl_engine.py`). A subset (`strict` False, e.g.
merged LoRA layers) cannot go that way: a fused layer loaded in part (q and v of qkv_proj) would be
rebuilt with its other part uninitialised; it goes to `model.load_weights` directly, which is right for
unquantized weights only, so a quantized model is refused with a clear error.
No vLLM import here, so the module loads anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from services.explorer.engines.weights_shm import SharedWeights, read_shared_weights


class QuantizedPartialLoadError(RuntimeError):
    """A subset of the weights cannot be loaded into a quantized vLLM model (no post-load processing)."""


class WeightSyncExtension:
    """Methods added to each vLLM worker (`self.device`, `self.rank`, `self.model_runner`,
    `self.model_config` and `reload_weights` come from it)."""

    _rft_group: Any = None

    def rft_join_group(self, info_bytes: bytes, rank_offset: int) -> int:
        from rft.v1 import common_pb2

        from services.common.weight_sync import BroadcastGroup, GroupInfo

        info = GroupInfo.from_proto(common_pb2.WeightSyncGroupInfo.FromString(info_bytes))
        rank = rank_offset + int(self.rank)  # type: ignore[attr-defined]
        self._rft_group = BroadcastGroup.join(info, rank, device=self.device)  # type: ignore[attr-defined]
        return rank

    def rft_receive(self, version: int) -> int:
        if self._rft_group is None:
            raise RuntimeError("rft_receive before rft_join_group")
        return self._rft_load(self._rft_group.receive(version), strict=True)

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
        if strict:
            # vLLM's post-load processing included (layerwise reload, checkpoint format)
            self.reload_weights(weights_iterator=counted, is_checkpoint_format=True)  # type: ignore[attr-defined]
        else:
            self._rft_require_unquantized()
            self.model_runner.model.load_weights(counted)  # type: ignore[attr-defined]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return counted.n

    def _rft_require_unquantized(self) -> None:
        quantization = self.model_config.quantization  # type: ignore[attr-defined]
        if quantization is not None:
            raise QuantizedPartialLoadError(
                f"the rollout model is quantized ({quantization}); a subset of its weights (e.g. merged "
                "LoRA layers) cannot be loaded without vLLM's post-load processing: sync the full state "
                "dict (a method other than lora_adapter) or use an unquantized model"
            )


class _Counted:
    """An iterable that counts what passes through it."""

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]):
        self._items, self.n = items, 0

    def __iter__(self):
        for item in self._items:
            self.n += 1
            yield item
