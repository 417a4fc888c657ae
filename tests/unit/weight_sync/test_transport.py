"""The WeightTransport interface: built by method name (the one method registry) and in-process
memory/checkpoint transfers."""

from __future__ import annotations

import pytest
import torch

from services.common.registry import RegistryError
from services.weight_sync import (
    SYNC_METHODS,
    Delivery,
    TransportOptions,
    WeightSyncError,
    WeightTransport,
    load_weights,
    make_transport,
    specs_of,
)
from services.weight_sync.transport import CheckpointTransport, MemoryTransport, NcclTransport


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight  # tied
    return m


def test_each_method_builds_its_transport_by_name_or_alias(tmp_path):
    transports = {n: SYNC_METHODS.get(n).transport for n in SYNC_METHODS.names()}
    assert transports == {
        "nccl": NcclTransport,
        "memory": MemoryTransport,
        "memory_bf16": MemoryTransport,
        "lora_adapter": MemoryTransport,
        "checkpoint": CheckpointTransport,
    }
    assert isinstance(make_transport("online"), NcclTransport)
    opts = TransportOptions(checkpoint_dir=str(tmp_path))
    assert isinstance(make_transport("offline", opts), CheckpointTransport)
    with pytest.raises(RegistryError, match="memory"):
        make_transport("memroy")


@pytest.mark.parametrize("method", ["memory", "checkpoint"])
def test_send_then_receive_moves_weights_bit_exactly(method, tmp_path):
    opts = TransportOptions(chunk_bytes=64, checkpoint_dir=str(tmp_path))
    sender, receiver = make_transport(method, opts), make_transport(method, opts)
    assert isinstance(sender, WeightTransport)
    src, dst = _model(0), _model(1)
    assert sender.prepare(specs_of(src.state_dict())) is None
    sender.build_group(None, 0)
    receiver.build_group(None, 1)
    delivery = sender.send(3, src.state_dict())
    assert delivery.version == 3 and delivery.model_version().step == 3
    load_weights(dst, receiver.receive(delivery))
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert dst[1].weight is dst[0].weight
    sender.finalize()
    receiver.finalize()


def test_memory_receive_checks_the_version():
    t = make_transport("memory")
    delivery = t.send(2, {"x": torch.ones(3)})
    with pytest.raises(WeightSyncError, match="version 2"):
        t.receive(Delivery(5, chunks=delivery.chunks))


def test_nccl_prepare_hands_out_a_rendezvous_and_needs_a_group():
    t = make_transport("nccl", TransportOptions(bucket_bytes=1 << 20, timeout_s=30))
    specs = specs_of({"x": torch.ones(3)})
    info = t.prepare(specs, world_size=3, generation=2)
    assert (info.world_size, info.generation, info.bucket_bytes, info.specs) == (3, 2, 1 << 20, tuple(specs))
    assert info.master_port > 0
    with pytest.raises(WeightSyncError, match="build_group"):
        t.send(1, {"x": torch.ones(3)})
    with pytest.raises(WeightSyncError):
        make_transport("checkpoint")  # no folder given
