"""`WeightDeltas`, the synchronizer's delta cache: which pulls get a delta, the bound on kept versions,
one computation per (base, latest) pair for concurrent pulls, and a full payload when the tensors differ;
the core's `pull_weights` in front of it (only the latest pushed version is kept)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from services.synchronizer.core import SynchronizerCore
from services.synchronizer.errors import NotKept
from services.synchronizer.servicer import ERRORS
from services.synchronizer.settings import SynchronizerSettings
from services.synchronizer.weights import PushAssembly, StoredWeights, WeightDeltas
from services.weight_sync import sync_method
from services.weight_sync.wire.chunks import encode_raw_chunks, join_raw_chunks, parse_raw_chunk
from services.weight_sync.wire.codec import decode_state_dict
from services.weight_sync.wire.delta import apply_delta


def stored(state: dict[str, torch.Tensor], version: int) -> StoredWeights:
    """What a complete push of `state` as `version` leaves in the store."""
    assembly = PushAssembly()
    for raw in encode_raw_chunks(state, version, chunk_bytes=4096):
        c = parse_raw_chunk(raw)
        assembly.add(
            version=c.version.version, step=c.version.step, index=c.index, total=c.total,
            total_bytes=c.total_bytes, nbytes=len(c.data), raw=raw,
        )  # fmt: skip
    return assembly.finish()


def versions(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    out = []
    for _ in range(n):
        w = w.clone()
        w.view(torch.int16)[torch.rand(w.shape, generator=g) < 0.05] += 1
        out.append({"w": w, "b": torch.ones(8)})
    return out


async def test_kept_base_gets_a_delta_that_applies_and_the_others_the_payload():
    states = versions(5)
    deltas = WeightDeltas(keep=3)
    kept = {}
    for v, state in enumerate(states, start=1):
        kept[v] = stored(state, v)
        chunks, is_delta = await deltas.chunks_for(kept[v], v - 1 if v > 1 else None)
        assert is_delta == (v > 1)
    latest = kept[5]
    for have, want_delta in [(4, True), (3, True), (2, False), (1, False), (None, False), (9, False)]:
        chunks, is_delta = await deltas.chunks_for(latest, have)
        assert is_delta == want_delta, have
        version, base, data = join_raw_chunks(chunks)
        assert version.version == 5 and base == (have if want_delta else None)
        payload = apply_delta(join_raw_chunks(kept[have].chunks)[2], data) if want_delta else data
        got, _ = decode_state_dict(payload)
        assert torch.equal(got["w"].view(torch.int16), states[4]["w"].view(torch.int16))
    assert deltas.deltas_computed == 4 + 1  # (v-1, v) for v = 2..5, then (3, 5)
    assert deltas.bytes_full == 4 * latest.total_bytes + latest.total_bytes  # v1, then have 2, 1, None, 9


async def test_concurrent_pulls_share_one_computation():
    a, b = (stored(s, v) for v, s in enumerate(versions(2), start=1))
    deltas = WeightDeltas()
    await deltas.chunks_for(a, None)
    answers = await asyncio.gather(*(deltas.chunks_for(b, 1) for _ in range(8)))
    assert all(is_delta for _, is_delta in answers) and deltas.deltas_computed == 1
    assert len({id(chunks) for chunks, _ in answers}) == 1  # the same cached chunks for every pull


async def test_different_tensors_or_a_big_delta_send_the_payload():
    a = stored({"w": torch.zeros(256)}, 1)
    b = stored({"v": torch.zeros(256)}, 2)  # same size, other names
    g = torch.Generator().manual_seed(0)
    c = stored({"v": torch.randn(256, generator=g)}, 3)  # every word changes: incompressible
    deltas = WeightDeltas()
    await deltas.chunks_for(a, None)
    assert (await deltas.chunks_for(b, 1))[1] is False
    assert (await deltas.chunks_for(c, 2))[1] is False
    assert deltas.bytes_delta == 0 and deltas.bytes_full == 3 * a.total_bytes


async def test_the_core_pulls_only_the_latest_pushed_version():
    core = SynchronizerCore(SynchronizerSettings(method=sync_method("memory")))
    with pytest.raises(NotKept, match="no weights were pushed yet"):
        await core.pull_weights()
    states = versions(2)
    first = stored(states[0], 1)
    await core.publish_memory(first)
    assert await core.pull_weights() == await core.pull_weights(1) == first.chunks
    await core.publish_memory(stored(states[1], 2))
    with pytest.raises(NotKept, match="version 1 is not kept; the latest is 2") as err:
        await core.pull_weights(1)
    assert ERRORS.status_of(err.value) == (grpc.StatusCode.NOT_FOUND, str(err.value))
    assert await core.pull_weights(2, have_version=1) != core.weights.chunks  # the cached delta
