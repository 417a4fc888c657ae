"""The checkpoint method's deltas (`weight_sync/wire/files.py` "Deltas"): the trainer's store writes,
before publishing a version, the delta from the published one beside its file; an explorer holding
that version's payload reads the delta instead of the file (checked tensor by tensor) and falls back
to the file when there is none, it is not from its version, or it does not check out; deltas go with
their versions when pruned; a delta no smaller than `max_ratio` of the file is not written."""

from __future__ import annotations

import asyncio

import torch
from rft.v1.common_pb2 import ModelVersion
from rft.v1.synchronizer_pb2 import WaitForVersionResponse

from services.weight_sync import Receiver, Sender, TransportOptions, sync_method
from services.weight_sync.wire.codec import decode_state_dict
from services.weight_sync.wire.files import CheckpointStore, delta_path, read_payload


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(128, 32, generator=g).to(torch.bfloat16)
    return {"embed.weight": emb, "lm_head.weight": emb, "norm.weight": torch.randn(32, generator=g)}


def _step(state: dict[str, torch.Tensor], rows: int = 8) -> dict[str, torch.Tensor]:
    """One training step's worth of change: a few rows move, the rest stays (ties kept)."""
    emb = state["embed.weight"].clone()
    emb[:rows] += 1
    return {"embed.weight": emb, "lm_head.weight": emb, "norm.weight": state["norm.weight"].clone()}


def test_a_version_is_read_as_the_delta_from_the_held_one_and_equals_its_file(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    v1 = _state()
    v2 = _step(v1)
    p1 = store.save(1, v1, delta=True)
    assert store.delta_bytes == 0 and not list(tmp_path.glob("*.delta"))  # nothing to diff against
    p2 = store.save(2, v2, delta=True)
    size = p2.stat().st_size
    assert delta_path(p2, 1).is_file() and 0 < store.delta_bytes < 0.2 * size
    held = (1, bytearray(p1.read_bytes()))
    payload, nbytes, from_delta = read_payload(p2, held)
    assert from_delta and nbytes == store.delta_bytes and payload == p2.read_bytes()
    got, _ = decode_state_dict(payload)
    assert all(torch.equal(got[k], t) for k, t in v2.items())
    assert got["lm_head.weight"].data_ptr() == got["embed.weight"].data_ptr()  # the tie restored

    # no delta from the version held, or a base that is not that version: the file, in full
    for other in [(7, held[1]), (1, bytearray(len(held[1])))]:
        payload, nbytes, from_delta = read_payload(p2, other)
        assert not from_delta and nbytes == size and payload == p2.read_bytes()
    assert read_payload(p2)[2] is False


def test_deltas_are_pruned_with_their_versions_and_a_large_one_is_not_written(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    states = [_state()]
    for _ in range(3):
        states.append(_step(states[-1]))
    for v, sd in enumerate(states, start=1):
        store.save(v, sd, delta=True)
    assert store.versions() == [3, 4]
    assert sorted(p.name for p in tmp_path.glob("*.delta")) == [
        "state_dict_v00000003.from_v00000002.delta",
        "state_dict_v00000004.from_v00000003.delta",
    ]
    store.save(5, _state(seed=9), delta=True, max_ratio=0.5)  # new weights: most words changed
    assert store.delta_bytes == 0 and not delta_path(store.path_of(5), 4).exists()


def test_the_checkpoint_method_reads_deltas_after_the_first_version(tmp_path):
    method = sync_method("checkpoint")
    sender = Sender(TransportOptions(checkpoint_dir=str(tmp_path), delta=True))
    loaded: dict[int, dict[str, torch.Tensor]] = {}

    async def load(named, version, strict=True):
        loaded[version] = {k: t.clone() for k, t in named}

    class Client:  # what CheckpointFetch reads of the SyncClient: its delta switch
        delta_pulls = True

    fetch = method.fetch(Client(), Receiver(load))
    states = [_state()]
    for _ in range(3):
        states.append(_step(states[-1]))

    async def run():
        for v, sd in enumerate(states, start=1):
            delivery = await method.send(sender, v, v, sd)
            answer = WaitForVersionResponse(
                model_version=ModelVersion(version=v, checkpoint_path=delivery.path)
            )
            assert await fetch(answer) == v

    asyncio.run(run())
    for v, sd in enumerate(states, start=1):
        assert all(torch.equal(loaded[v][k], t) for k, t in sd.items()), v
    full = (tmp_path / "state_dict_v00000004.safetensors").stat().st_size  # every version's size
    assert fetch.bytes_full == full and 0 < fetch.bytes_delta < 0.5 * full
