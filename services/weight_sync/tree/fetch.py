"""The explorer's side of the memory methods' fan-out (`synchronizer.fanout` > 0).

An explorer with a relay (`relay_rpc.serve_relay`: a `PullWeights` server beside its service; its
address goes to the synchronizer at registration, `SyncClient.relay`) fetches each version through it:
the version the `WaitForVersion` answer names, along the answer's `weight_sources` (its parent's relay,
the grandparent's, ...; empty for the root's children) and then the synchronizer. The chunks land in
the relay's store as they arrive, so this explorer's own children stream them at the same time.

What is done with the weights stays the method's own: `RelayFetch` first brings the version into the
relay, then runs the method's fetch (`SyncMethod.fetch`: `MemoryFetch`, the LoRA adapter's merge, a
plug-in's) over a `RelayPuller`, whose `pull_weights` answers from the relay's complete copy of that
version (`SyncClient.decode_raw`: joined, a delta applied to the payload this explorer holds, decoded,
in a thread) and otherwise is the `SyncClient`'s. The relay asks its sources for a delta from the
version this explorer holds (`SyncClient.held_version`), so with `delta_sync` every hop of the tree
carries the delta (store.py "Deltas"); a relayed delta that does not apply is pulled again in full. So when the tree cannot
deliver the version (every source failed, or the synchronizer moved on: NOT_FOUND), the method pulls
from the synchronizer as it does without fan-out (with its deltas), and fan-out never fails a sync
that the star would have done. Nothing is loaded from the relay unless its stream is complete and
checked (`relay.ChunkCheck`, then `join_raw_chunks` again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from services.common.log import get_logger
from services.weight_sync.errors import WeightSyncError
from services.weight_sync.method import Fetch, Receiver, SyncMethod, WaitAnswer
from services.weight_sync.tree.plan import ROOT
from services.weight_sync.tree.server import RelayNode, serve_relay

if TYPE_CHECKING:
    from services.common.config import RFTConfig

log = get_logger("weight_sync.tree.fetch")


class RelayPuller:
    """A `SyncClient` whose `pull_weights` of the version `expect` comes from the relay's copy."""

    def __init__(self, client: Any, node: RelayNode):
        self.client, self.node = client, node
        self.expect = 0  # the version RelayFetch brought into the relay (0 = none)
        self.from_relay = 0  # versions loaded from the relay's copy
        self.delta_loads = 0  # of those, the ones that came as a delta

    def __getattr__(self, name: str) -> Any:  # every other call is the client's
        return getattr(self.client, name)

    async def pull_weights(self, version: int = 0, device: str | torch.device = "cpu", **kw: Any):
        stream = self.node.store.get(version or self.expect) if (version or self.expect) else None
        if stream is None or not stream.complete:
            return await self.client.pull_weights(version, device, **kw)
        try:  # a full payload, or a delta from the version this client holds (store.py "Deltas")
            mv, state_dict = await self.client.decode_raw(stream.chunks, device)
        except WeightSyncError as exc:
            log.warning("relayed weights did not apply; pulling from the synchronizer",
                        version=stream.version, error=str(exc)[:300])  # fmt: skip
            return await self.client.pull_weights(version, device, **kw)
        self.from_relay += 1
        self.delta_loads += stream.base is not None
        return mv, state_dict


class RelayFetch:
    """Bring the answer's version into the relay along its `weight_sources`, then run `inner` (the
    method's fetch over `puller`); on a relay failure `inner` pulls from the synchronizer."""

    def __init__(self, node: RelayNode, puller: RelayPuller, inner: Fetch):
        self.node, self.puller, self.inner = node, puller, inner
        self.fallbacks = 0

    async def __call__(self, answer: WaitAnswer) -> int:
        version = int(answer.model_version.version)
        chain = [*getattr(answer, "weight_sources", ()), ROOT]
        try:
            await self.node.fetch(version, chain, getattr(self.puller.client, "held_version", None))
            self.puller.expect = version
            log.info("weights relayed", version=version, relays=len(chain) - 1)  # relays: in its chain
        except WeightSyncError as exc:
            self.fallbacks += 1
            self.puller.expect = 0
            log.warning("relay fetch failed; pulling from the synchronizer", version=version,
                        error=str(exc)[:300])  # fmt: skip
        return await self.inner(answer)


def relay_fetch(method: SyncMethod, client: Any, receiver: Receiver, node: RelayNode) -> RelayFetch:
    """`method`'s fetch for an explorer whose relay is `node`."""
    puller = RelayPuller(client, node)
    node.held = lambda: getattr(client, "held_version", None)  # a pull-through asks for a delta too
    return RelayFetch(node, puller, method.fetch(puller, receiver))


async def explorer_fetch(
    config: RFTConfig, method: SyncMethod, client: Any, receiver: Receiver, *, fanout: int
) -> Fetch:
    """The explorer's fetch: `method.fetch(client, receiver)`, through a relay served beside the
    explorer when `fanout` > 0 (the run's tree fan-out as its settings record holds it,
    `SyncMethod.tree_fanout`: a pushed method and `synchronizer.fanout` > 0; `client.relay`,
    registered with the synchronizer and closed with the client)."""
    if fanout <= 0:
        return method.fetch(client, receiver)
    svc, me = config.services, config.services.explorer
    client.relay = await serve_relay(
        client.channel, client.member_id, host=me.host,
        advertise_host=me.address.rsplit(":", 1)[0] if me.address else "",
        auth_token=svc.auth_token, tls=svc.tls, timeout_s=svc.rpc_timeout,
        sync_timeout_s=config.synchronizer.sync_timeout,
    )  # fmt: skip
    log.info("weight relay serving", address=client.relay.address, fanout=fanout)
    return relay_fetch(method, client, receiver, client.relay.node)
