"""The memory method's fetch through the explorer's relay (`synchronizer.fanout` > 0).

An explorer with a relay (`relay_rpc.serve_relay`: a `PullWeights` server beside its service; its
address goes to the synchronizer at registration) fetches each version through it: the version
the `WaitForVersion` answer names, along the answer's `weight_sources` (its parent's relay, the
grandparent's, ...; empty for the root's children) and then the synchronizer. The chunks land in the
relay's store as they arrive, so this explorer's own children stream them at the same time; the
state dict is decoded and loaded only once the stream is complete and checked.

When the tree cannot deliver that version (every source failed, or the synchronizer already moved
on: NOT_FOUND), the fetch falls back to the plain pull of the latest version from the synchronizer
(`MemoryFetch`), so fan-out never makes an explorer fail a sync that the star would have done.
"""

from __future__ import annotations

import asyncio

import torch

from services.common.log import get_logger
from services.common.weight_sync.codec import decode_state_dict
from services.common.weight_sync.errors import WeightSyncError
from services.common.weight_sync.fanout import ROOT
from services.common.weight_sync.memory import join_raw_chunks
from services.common.weight_sync.method import Fetch, Load, WaitAnswer
from services.common.weight_sync.relay_rpc import RelayNode

log = get_logger("weight_sync.relay_fetch")


class RelayFetch:
    """Fetch-and-load through `node` along the answer's `weight_sources`; `fallback` when that fails."""

    def __init__(self, node: RelayNode, load: Load, fallback: Fetch, device: str | torch.device = "cpu"):
        self.node, self.load, self.fallback, self.device = node, load, fallback, device
        self.fallbacks = 0

    async def __call__(self, answer: WaitAnswer) -> int:
        version = int(answer.model_version.version)
        chain = [*getattr(answer, "weight_sources", ()), ROOT]
        try:
            stream = await self.node.fetch(version, chain)
            _, _, payload = await asyncio.to_thread(join_raw_chunks, stream.chunks)
        except WeightSyncError as exc:
            self.fallbacks += 1
            log.warning("relay fetch failed; pulling the latest from the synchronizer", version=version,
                        error=str(exc)[:300])  # fmt: skip
            return await self.fallback(answer)
        state_dict, _ = await asyncio.to_thread(decode_state_dict, payload, self.device)
        await self.load(state_dict.items(), version)
        return version


def relay_fetch(node: RelayNode | None, load: Load, fallback: Fetch) -> Fetch:
    """`RelayFetch` when the explorer serves a relay, else `fallback` as it is."""
    return fallback if node is None else RelayFetch(node, load, fallback)
