"""Long polls outlast the channel's default deadline (`services.rpc_timeout`): gRPC would use the smaller
of the service config's timeout and the caller's deadline, so `WaitForVersion` and `RequestSync` get
none in the service config (`services/common/rpc/client.py` LONG_POLLS) and wait as long as asked."""

from __future__ import annotations

import asyncio

from services.common.rpc import create_channel
from services.weight_sync import specs_of
from services.weight_sync.member.client import SyncClient
from tests.support.weight_sync_worker import make_state_dict

RPC_TIMEOUT_S = 2.0  # the channel's default deadline
WAIT_S = 5.0  # what the long polls ask for


async def _client(address: str, member_id: str, role: str) -> SyncClient:
    channel = create_channel(address, timeout_s=RPC_TIMEOUT_S)
    client = SyncClient(channel, member_id, role, timeout_s=RPC_TIMEOUT_S, owns_channel=True)
    await client.register()
    return client


async def test_wait_for_version_waits_past_the_channel_deadline(sync_server):
    core, address = await sync_server(method="memory")
    explorer = await _client(address, "e1", "explorer")
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        answer = await explorer.wait_for_version(step=3, timeout_s=WAIT_S)  # nothing is published
        assert answer.timed_out and loop.time() - start >= WAIT_S - 0.1
    finally:
        await explorer.close()


async def test_request_sync_handshake_waits_past_the_channel_deadline(sync_server):
    """nccl: the trainer's handshake waits for an explorer that comes after the channel's deadline."""
    core, address = await sync_server(method="nccl", sync_timeout=60)
    trainer = await _client(address, "trainer", "trainer")
    explorer = await _client(address, "e1", "explorer")
    try:
        await trainer.get_weight_sync_info(specs_of(make_state_dict(2)))
        handshake = asyncio.create_task(trainer.request_sync(step=1, timeout_s=WAIT_S * 4))
        await core.wait_until(lambda: core.broadcast_generation > 0, 10)
        await asyncio.sleep(RPC_TIMEOUT_S * 2)  # ok-sleep: the explorer comes after the channel's deadline
        answer = await explorer.wait_for_version(step=2, timeout_s=WAIT_S)
        decision = await handshake
        assert answer.receive_broadcast and decision.accepted
    finally:
        await trainer.close()
        await explorer.close()
