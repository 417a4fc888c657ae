"""`synchronizer.fanout` end to end over real `grpc.aio` servers: explorers serving relays register
their addresses, the synchronizer's `WaitForVersion` answers name each one's chain of relays
(`weight_sources`), and the explorers' fetches (`relay_fetch` over the memory method) load the pushed
version through the tree while the synchronizer sends only its k children a copy."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch

from services.common.config.services import Endpoint
from services.weight_sync import sync_method
from services.weight_sync.method import Receiver
from services.weight_sync.tree.fetch import RelayFetch, explorer_fetch, relay_fetch
from services.weight_sync.tree.server import serve_relay


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(128, 64, generator=g), "b": torch.randn(64, generator=g).to(torch.bfloat16)}


async def test_explorers_get_their_chains_and_load_through_the_tree(sync_server, sync_clients):
    core, address = await sync_server(method="memory", fanout=2)
    trainer = await sync_clients(address, "trainer", "trainer")
    explorers = []
    for i in range(5):
        client = await sync_clients(address, f"e{i}", "explorer", register=False)
        client.relay = await serve_relay(client.channel, f"e{i}", timeout_s=10)  # closed with the client
        await client.register()
        explorers.append(client)
    sd = weights(1)
    await trainer.push_weights(sd, version=1, chunk_bytes=4 << 10)
    answers = [await e.wait_for_version(min_version=1, timeout_s=10) for e in explorers]
    relay = [e.relay.address for e in explorers]
    assert [tuple(a.weight_sources) for a in answers] == [(), (), (relay[0],), (relay[0],), (relay[1],)]
    loaded: dict[int, dict] = {}

    def fetch_for(i: int) -> RelayFetch:
        async def load(named, version):
            loaded[i] = dict(named)

        return relay_fetch(sync_method("memory"), explorers[i], Receiver(load), explorers[i].relay.node)

    fetches = [fetch_for(i) for i in range(5)]
    got = await asyncio.gather(*[f(a) for f, a in zip(fetches, answers, strict=True)])
    assert got == [1] * 5 and [f.fallbacks for f in fetches] == [0] * 5
    assert [f.puller.from_relay for f in fetches] == [1] * 5
    for i in range(5):
        assert all(torch.equal(loaded[i][k], t) for k, t in sd.items()), i
    assert core.weight_deltas.bytes_full == 2 * core.weights.total_bytes  # only the root's 2 children


async def test_fanout_zero_answers_no_chain_and_explorer_fetch_serves_a_relay_only_with_fanout(
    sync_server, sync_clients
):
    _, address = await sync_server(method="memory")
    explorer = await sync_clients(address, "e0", "explorer")
    trainer = await sync_clients(address, "trainer", "trainer")
    await trainer.push_weights(weights(2), version=1)
    assert list((await explorer.wait_for_version(min_version=1, timeout_s=10)).weight_sources) == []

    async def load(named, version):
        return None

    def config() -> SimpleNamespace:
        services = SimpleNamespace(explorer=Endpoint(), auth_token=None, tls=None, rpc_timeout=10.0)
        return SimpleNamespace(services=services, synchronizer=SimpleNamespace(sync_timeout=20.0))

    memory, files = sync_method("memory"), sync_method("checkpoint")
    assert (memory.tree_fanout(0), memory.tree_fanout(2), files.tree_fanout(2)) == (0, 2, 0)
    plain = await explorer_fetch(config(), memory, explorer, Receiver(load), fanout=memory.tree_fanout(0))
    assert not isinstance(plain, RelayFetch) and explorer.relay is None
    served = await explorer_fetch(config(), memory, explorer, Receiver(load), fanout=memory.tree_fanout(2))
    assert isinstance(served, RelayFetch) and explorer.relay.address.startswith("127.0.0.1:")
    by_file = await explorer_fetch(config(), files, explorer, Receiver(load), fanout=files.tree_fanout(2))
    assert not isinstance(by_file, RelayFetch)  # not a pushed method: no relay
