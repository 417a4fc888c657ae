"""Bounds of synchronizer requests on a real grpc.aio server (synchronizer.proto states them): a member id,
an address, a report message, a checkpoint path, a tensor list, a tensor name or shape over its bound is
INVALID_ARGUMENT naming the field, with a short message, and registers or changes nothing."""

from __future__ import annotations

import grpc
import pytest
from rft.v1 import common_pb2, synchronizer_pb2, synchronizer_pb2_grpc

from services.common.rpc import create_channel

EXPLORER = synchronizer_pb2.MEMBER_ROLE_EXPLORER


async def _refused(call, field: str, *texts: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details[:300]
    assert details.startswith(field + ":") and len(details) < 400, details[:300]
    for text in texts:
        assert text in details, details


async def test_every_string_and_list_of_a_request_is_bounded(sync_server):
    _, address = await sync_server(method="nccl")
    channel = create_channel(address, timeout_s=10)
    stub = synchronizer_pb2_grpc.SynchronizerServiceStub(channel)
    try:
        huge = "m" * 10_000
        member = synchronizer_pb2.Member
        await _refused(stub.Register(synchronizer_pb2.RegisterRequest(member=member(member_id=huge, role=EXPLORER))),
                       "member.member_id", "10000 characters", "128")  # fmt: skip
        await _refused(stub.Register(synchronizer_pb2.RegisterRequest(
            member=member(member_id="e0", role=EXPLORER, address="a" * 257))), "member.address", "256")  # fmt: skip
        await _refused(stub.Heartbeat(synchronizer_pb2.HeartbeatRequest(member_id=huge)), "member_id")
        await _refused(stub.RequestSync(synchronizer_pb2.RequestSyncRequest(member_id=huge)), "member_id")
        await _refused(
            stub.WaitForVersion(synchronizer_pb2.WaitForVersionRequest(member_id=huge)), "member_id"
        )
        await _refused(stub.ReportSync(synchronizer_pb2.ReportSyncRequest(member_id="e0", message="x" * 4097)),
                       "message", "4096")  # fmt: skip
        await _refused(stub.NotifyCheckpoint(common_pb2.ModelVersion(version=1, checkpoint_path="/" * 4097)),
                       "checkpoint_path")  # fmt: skip
        tensor = common_pb2.TensorMeta
        group_of = synchronizer_pb2.SyncGroupRequest
        await _refused(stub.GetWeightSyncInfo(group_of(member_id="t", tensors=[tensor(name="n" * 1025)])),
                       "tensors[0].name", "1024")  # fmt: skip
        long_shape = [tensor(name="w"), tensor(name="v", shape=[1] * 17)]
        await _refused(
            stub.GetWeightSyncInfo(group_of(member_id="t", tensors=long_shape)), "tensors[1].shape", "16"
        )
        many = [tensor(name="w")] * ((1 << 20) + 1)
        await _refused(
            stub.GetWeightSyncInfo(group_of(member_id="t", tensors=many)), "tensors", "1048577 entries"
        )
        pull = stub.PullWeights(synchronizer_pb2.PullWeightsRequest(member_id=huge))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in pull:
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(
            "member_id:"
        )
        # nothing registered; ids at the bound are fine
        assert not (await stub.GetRunState(synchronizer_pb2.GetRunStateRequest())).members
        ok = member(member_id="e" * 128, role=EXPLORER, address="h" * 250 + ":50052")
        await stub.Register(synchronizer_pb2.RegisterRequest(member=ok))
        state = await stub.GetRunState(synchronizer_pb2.GetRunStateRequest())
        assert [m.member_id for m in state.members] == ["e" * 128]
    finally:
        await channel.close()
