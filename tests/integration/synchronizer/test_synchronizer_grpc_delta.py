"""Delta pulls over a real synchronizer server (memory and memory_bf16): a trainer pushes versions
1..5 of the tiny Qwen2 with small changes; explorers that pull every version get deltas (computed
once per version whatever the number of explorers), a late joiner and an explorer too far behind get
the full payload, a receiver whose base is corrupted falls back to the full payload, and every pulled
state dict hashes like the pushed one."""

from __future__ import annotations

import asyncio

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.modeling import load_model
from services.weight_sync import sync_method, weights_digest
from services.weight_sync.methods.builtin import MemoryFetch


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("delta_tiny") / "model")


def step_weights(model: torch.nn.Module, seed: int, frac: float = 0.02) -> dict[str, torch.Tensor]:
    """A small training-like change: `frac` of the weights move by ~1% (tied weights stay tied)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < frac
            p.add_(mask * p * 0.01 * torch.randn(p.shape, generator=g))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("method_name", ["memory", "memory_bf16"])
async def test_delta_pulls_are_bit_exact_and_small(tiny_dir, sync_server, sync_clients, method_name):
    core, address = await sync_server(method=method_name)
    method = sync_method(method_name)
    trainer = await sync_clients(address, "trainer", "trainer")
    followers = [await sync_clients(address, f"e{i}", "explorer") for i in range(2)]
    behind = await sync_clients(address, "behind", "explorer")
    source = load_model(tiny_dir)

    loaded: dict[str, list[tuple[int, str]]] = {c.member_id: [] for c in followers}

    def loader(member_id: str):
        async def load(named, version):
            loaded[member_id].append((version, weights_digest(dict(named))))

        return load

    fetches = [MemoryFetch(c, loader(c.member_id)) for c in followers]
    pushed: dict[int, str] = {}
    for version in range(1, 6):
        wire = method.encode(step_weights(source, seed=version))
        pushed[version] = weights_digest(wire)
        await trainer.push_weights(wire, version=version, step=version, chunk_bytes=64 << 10)
        await asyncio.gather(*(fetch(None) for fetch in fetches))  # both pull the same version at once
        if version == 1:
            got_version, got = await behind.pull_weights()
            assert got_version.version == 1 and weights_digest(got) == pushed[1]
    full = core.weights.total_bytes

    for c in followers:
        assert loaded[c.member_id] == [(v, pushed[v]) for v in range(1, 6)]
        assert c.pulled_bytes_full == full  # version 1 only
        assert 0 < c.pulled_bytes_delta < 0.25 * 4 * full, (c.pulled_bytes_delta, full)
        assert c.delta_fallbacks == 0
    deltas = core.weight_deltas
    assert deltas.deltas_computed == 4  # (1,2) .. (4,5): once each, for two explorers

    late = await sync_clients(address, "late", "explorer")
    v, got = await late.pull_weights()  # joins at version 5: holds nothing, gets the full payload
    assert v.version == 5 and weights_digest(got) == pushed[5]
    assert (late.pulled_bytes_full, late.pulled_bytes_delta) == (full, 0)

    v, got = await behind.pull_weights()  # holds version 1, no longer kept: the full payload
    assert v.version == 5 and weights_digest(got) == pushed[5]
    assert (behind.pulled_bytes_full, behind.pulled_bytes_delta) == (2 * full, 0)

    state = await trainer.get_run_state()
    assert state.weight_bytes_delta == sum(c.pulled_bytes_delta for c in followers)
    assert state.weight_bytes_full == 5 * full  # 2 followers + behind at v1, late and behind at v5
    assert state.weight_deltas_computed == 4


async def test_a_delta_that_does_not_apply_falls_back_to_the_full_payload(
    tiny_dir, sync_server, sync_clients
):
    core, address = await sync_server(method="memory_bf16")
    method = sync_method("memory_bf16")
    trainer = await sync_clients(address, "trainer", "trainer")
    explorer = await sync_clients(address, "e0", "explorer")
    source = load_model(tiny_dir)
    await trainer.push_weights(method.encode(step_weights(source, seed=1)), version=1)
    await explorer.pull_weights()
    held = explorer._held[1]
    held[len(held) // 2] ^= 0x01  # the receiver's copy no longer matches the sender's version 1

    wire = method.encode(step_weights(source, seed=2))
    await trainer.push_weights(wire, version=2)
    v, got = await explorer.pull_weights()
    assert v.version == 2 and weights_digest(got) == weights_digest(wire)
    assert explorer.delta_fallbacks == 1 and explorer.pulled_bytes_delta > 0
    assert explorer.pulled_bytes_full == 2 * core.weights.total_bytes

    wire = method.encode(step_weights(source, seed=3))
    await trainer.push_weights(wire, version=3)
    v, got = await explorer.pull_weights(delta=False)  # an old client: no have_version, a full payload
    assert v.version == 3 and weights_digest(got) == weights_digest(wire)
    assert explorer.pulled_bytes_full == 3 * core.weights.total_bytes and explorer._held is None


async def test_delta_sync_off_pulls_every_version_in_full(tiny_dir, sync_server, sync_clients):
    """`synchronizer.delta_sync: false` (the client's `delta_pulls`): no have_version is sent, every
    pull is the full payload and no payload is kept on the explorer."""
    core, address = await sync_server(method="memory_bf16")
    method = sync_method("memory_bf16")
    trainer = await sync_clients(address, "trainer", "trainer")
    explorer = await sync_clients(address, "e0", "explorer", delta_pulls=False)
    source = load_model(tiny_dir)
    for version in (1, 2, 3):
        wire = method.encode(step_weights(source, seed=version))
        await trainer.push_weights(wire, version=version)
        v, got = await explorer.pull_weights()
        assert v.version == version and weights_digest(got) == weights_digest(wire)
        assert explorer._held is None
    assert explorer.pulled_bytes_delta == 0
    assert explorer.pulled_bytes_full == 3 * core.weights.total_bytes


async def test_delta_sync_follows_the_config():
    from services.common.config import RFTConfig
    from services.weight_sync.member.client import SyncClient

    on = SyncClient.from_config(RFTConfig(), "e0", "explorer")
    off = SyncClient.from_config(RFTConfig(synchronizer={"delta_sync": False}), "e1", "explorer")
    try:
        assert on.delta_pulls is True and off.delta_pulls is False
    finally:
        await on.close()
        await off.close()
