"""A relay's `PullWeights` over real `grpc.aio` servers on port 0: a `SyncClient` pointed at a peer
pulls from it unchanged; versions a relay does not hold answer NOT_FOUND; a peer that is down is
skipped at once for the next source in the chain; a relay pulls through a version a child asks for
first; the explorer's `RelayFetch` loads through its relay and falls back to the method's own pull."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch
from rft.v1.common_pb2 import ModelVersion
from rft.v1.synchronizer_pb2 import WaitForVersionResponse

from services.common.rpc import create_channel
from services.common.weight_sync import sync_method
from services.common.weight_sync.fanout import ROOT
from services.common.weight_sync.method import Receiver
from services.common.weight_sync.relay_fetch import relay_fetch
from services.common.weight_sync.relay_rpc import serve_relay


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g).to(torch.bfloat16)}


@pytest.fixture
async def relays():
    """`await relays(sync_address)` -> (node, address): `serve_relay` on port 0; closed after the test."""
    made = []

    async def make(sync_address: str, **kw):
        sync_channel = create_channel(sync_address, timeout_s=10)
        relay = await serve_relay(sync_channel, "relay", timeout_s=10, **kw)
        made.append((relay, sync_channel))
        return relay.node, relay.address

    yield make
    for relay, channel in made:
        await relay.close()
        await channel.close()


async def test_a_sync_client_pulls_from_a_relay_as_from_the_synchronizer(sync_server, sync_clients, relays):
    core, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    sd = weights(1)
    await trainer.push_weights(sd, version=1, chunk_bytes=4 << 10)
    parent, parent_addr = await relays(address)
    child, _ = await relays(address)
    child_fetch = asyncio.ensure_future(child.fetch(1, [parent_addr]))  # the parent alone: no fallback
    await child.store.stream_for(1, wait_s=10)  # the child asked first; the parent begins it now
    parent_stream = await parent.fetch(1, [ROOT])
    stream = await child_fetch
    assert stream.complete and stream.chunks == parent_stream.chunks == list(core.weights.chunks)

    explorer = await sync_clients(parent_addr, "e0", "explorer", register=False)
    for _ in range(2):  # the second pull names have_version 1: a relay answers with the full payload
        version, got = await explorer.pull_weights()
        assert version.version == 1 and all(torch.equal(got[k], v) for k, v in sd.items())
    assert explorer.pulled_bytes_full == 2 * core.weights.total_bytes and explorer.delta_fallbacks == 0


async def test_a_relay_refuses_what_it_does_not_hold_and_a_dead_peer_is_skipped(
    sync_server, sync_clients, relays
):
    _, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    await trainer.push_weights(weights(2), version=2, chunk_bytes=4 << 10)
    node, node_addr = await relays(address, wait_s=0.05)
    explorer = await sync_clients(node_addr, "e0", "explorer", register=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await explorer.pull_weights(version=7)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "version 7" in err.value.details()

    dead = "127.0.0.1:1"  # nothing listens there: the call fails at once, not after a stall timeout
    stream = await node.fetch(2, [dead, ROOT])
    assert stream.complete and stream.check.version == 2


async def test_a_relay_pulls_through_a_version_a_child_asks_for_first(sync_server, sync_clients, relays):
    _, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    parent, parent_addr = await relays(address)
    child, _ = await relays(address)
    await trainer.push_weights(weights(1), version=1, chunk_bytes=4 << 10)
    await parent.fetch(1, [ROOT])  # the parent's last chain: the synchronizer
    await trainer.push_weights(weights(2), version=2, chunk_bytes=4 << 10)
    stream = await child.fetch(2, [parent_addr])  # the parent has not asked for version 2 itself
    assert stream.complete and parent.store.latest_complete().chunks == stream.chunks
    assert (await parent.fetch(2, [ROOT])) is parent.store.get(2)  # its own fetch finds it there


async def test_relay_fetch_loads_through_the_relay_and_falls_back_to_the_synchronizer(
    sync_server, sync_clients, relays
):
    _, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    explorer = await sync_clients(address, "e0", "explorer")
    node, _ = await relays(address)
    sd = weights(3)
    await trainer.push_weights(sd, version=3, chunk_bytes=4 << 10)
    loaded: list[tuple[int, dict]] = []

    async def load(named, version):
        loaded.append((version, dict(named)))

    fetch = relay_fetch(sync_method("memory"), explorer, Receiver(load), node)
    assert await fetch(WaitForVersionResponse(model_version=ModelVersion(version=3))) == 3
    assert node.store.latest_complete().version == 3 and fetch.fallbacks == 0
    assert fetch.puller.from_relay == 1 and explorer.pulled_bytes_full == 0  # nothing from the synchronizer
    # version 9 is not kept anywhere: the relay path fails and the method's own pull loads the latest
    assert await fetch(WaitForVersionResponse(model_version=ModelVersion(version=9))) == 3
    assert fetch.fallbacks == 1 and explorer.pulled_bytes_full > 0 and [v for v, _ in loaded] == [3, 3]
    assert all(torch.equal(loaded[-1][1][k], t) for k, t in sd.items())
