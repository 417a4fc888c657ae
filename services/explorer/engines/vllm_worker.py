"""vLLM worker extension for weight updates (`worker_extension_cls`), after vLLM's RLHF examples.

vLLM mixes this class into every GPU worker; the engine reaches its methods with `collective_rpc`.
Each worker joins the weight-sync broadcast group as rank `rank_offset + worker rank` (the trainer's
rank 0 sends), receives every tensor in full and hands it to the model's own `load_weights`, which
shards it for tensor parallelism (passed positionally, as vLLM's own loader does: not every model names
the parameter `weights`). No vLLM import here, so the module loads anywhere.
"""

from __future__ import annotations

from typing import Any

import torch


class WeightSyncExtension:
    """Methods added to each vLLM worker (`self.device`, `self.rank`, `self.model_runner` come from it)."""

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
        loaded = self.model_runner.model.load_weights(self._rft_group.receive(version))  # type: ignore[attr-defined]
        torch.cuda.synchronize()
        return len(loaded or ())

    def rft_load_named(self, named: list[tuple[str, torch.Tensor]]) -> int:
        device = self.device  # type: ignore[attr-defined]
        weights = ((n, t.to(device, non_blocking=True)) for n, t in named)
        loaded = self.model_runner.model.load_weights(weights)  # type: ignore[attr-defined]
        torch.cuda.synchronize()
        return len(loaded or ())

    def rft_leave(self) -> None:
        if self._rft_group is not None:
            self._rft_group.close()
            self._rft_group = None
