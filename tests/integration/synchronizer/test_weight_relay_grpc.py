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
from services.weight_sync import sync_method
from services.weight_sync.method import Receiver
from services.weight_sync.tree.fetch import relay_fetch
from services.weight_sync.tree.plan import ROOT
from services.weight_sync.tree.server import serve_relay


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
    assert explorer.relayed_bytes_full > 0 and explorer.held_version == 3  # the relay's copy, kept as held
    # version 9 is not kept anywhere: the relay path fails and the method's own pull loads the latest
    assert await fetch(WaitForVersionResponse(model_version=ModelVersion(version=9))) == 3
    pulled = explorer.pulled_bytes_full + explorer.pulled_bytes_delta  # a delta from the held 3
    assert fetch.fallbacks == 1 and pulled > 0 and [v for v, _ in loaded] == [3, 3]
    assert all(torch.equal(loaded[-1][1][k], t) for k, t in sd.items())


def _next(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A training step's worth of change: a few rows of `w` move, the rest stays (a small delta)."""
    out = {k: v.clone() for k, v in sd.items()}
    out["w"][:4] += 0.5
    return out


async def test_relays_pass_a_delta_down_the_tree_and_a_late_joiner_gets_the_payload(
    sync_server, sync_clients, relays
):
    """Root child A and its child B hold version 1; version 2 goes synchronizer -> A -> B as one
    delta (computed once), loaded bit-exact by both, with nothing pulled from the synchronizer by B.
    C, a late joiner under A holding nothing, is refused A's delta (NOT_FOUND) and takes the full
    payload from the next source in its chain, the synchronizer."""
    core, address = await sync_server(method="memory")
    trainer = await sync_clients(address, "trainer", "trainer")
    v1 = weights(5)
    v2 = _next(v1)
    await trainer.push_weights(v1, version=1, chunk_bytes=4 << 10)
    nodes = {n: await relays(address) for n in "ABC"}
    chains = {"A": [ROOT], "B": [nodes["A"][1], ROOT], "C": [nodes["A"][1], ROOT]}
    loaded: dict[str, dict[int, dict]] = {n: {} for n in "ABC"}
    fetches, clients = {}, {}
    for n in "ABC":
        clients[n] = await sync_clients(address, f"e{n}", "explorer")

        async def load(named, version, n=n):
            loaded[n][version] = dict(named)

        fetches[n] = relay_fetch(sync_method("memory"), clients[n], Receiver(load), nodes[n][0])

    def answer(version: int, n: str) -> WaitForVersionResponse:
        return WaitForVersionResponse(
            model_version=ModelVersion(version=version), weight_sources=chains[n][:-1]
        )

    for n in "AB":
        assert await fetches[n](answer(1, n)) == 1
    await trainer.push_weights(v2, version=2, chunk_bytes=4 << 10)
    before = {n: (clients[n].pulled_bytes_full, clients[n].pulled_bytes_delta) for n in "AB"}
    for n in "AB":
        assert await fetches[n](answer(2, n)) == 2
    for n in "AB":
        assert all(torch.equal(loaded[n][2][k], t) for k, t in v2.items()), n
        assert fetches[n].puller.delta_loads == 1 and fetches[n].fallbacks == 0
    a_stream, b_stream = nodes["A"][0].store.get(2), nodes["B"][0].store.get(2)
    assert a_stream.base == 1 and b_stream.chunks == a_stream.chunks  # the delta, passed on unchanged
    delta_bytes = clients["B"].relayed_bytes_delta
    assert 0 < delta_bytes < 0.5 * core.weights.total_bytes
    assert (clients["B"].pulled_bytes_full, clients["B"].pulled_bytes_delta) == before["B"]  # all via A
    assert core.weight_deltas.deltas_computed == 1

    assert await fetches["C"](answer(2, "C")) == 2  # holds nothing: A's delta is not for it
    c_stream = nodes["C"][0].store.get(2)
    assert c_stream.complete and c_stream.base is None and list(c_stream.chunks) == list(core.weights.chunks)
    assert all(torch.equal(loaded["C"][2][k], t) for k, t in v2.items()) and fetches["C"].fallbacks == 0
    assert (
        fetches["C"].puller.delta_loads == 0 and clients["C"].relayed_bytes_full == core.weights.total_bytes
    )
