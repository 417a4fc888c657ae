"""An explorer's report of a load survives a synchronizer that is away or restarted (forgot it).

The explorer's sync gate sends the report in the background while the next step samples (serve mode
and the in-flight follower send it the same way, `SyncClient.report_load`); a synchronizer killed and
restarted in between answers NOT_FOUND. The member registers again (the registration carries the held
version) instead of failing the explorer, and while the synchronizer is unreachable the report is
retried for at most the sync timeout, then dropped without raising.
"""

from __future__ import annotations

import asyncio

import pytest

from services.common.config.sync_plan import SyncPlan
from services.common.rpc import create_channel, start_server
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.servicer import registration
from services.synchronizer.settings import SynchronizerSettings
from services.weight_sync import sync_method
from services.weight_sync.member.client import SyncClient


@pytest.fixture
async def synchronizer():
    sync = SynchronizerCore(SynchronizerSettings(method=sync_method("memory"), plan=SyncPlan("fixed", 1, 1)))
    await sync.start()
    server = await start_server([registration(sync)], port=0)
    client = SyncClient(create_channel(server.address), "ex1", "explorer", timeout_s=5, owns_channel=True)
    try:
        yield sync, server, client
    finally:
        await client.close()
        await server.stop(0)
        await sync.close()


async def test_a_report_to_a_synchronizer_that_forgot_the_explorer_registers_it_with_the_version(
    synchronizer,
):
    sync, _, client = synchronizer
    await client.register()
    sync.members.clear()  # what a restarted synchronizer knows of its members
    await client.report_load(3, True, 0, within_s=5)  # NOT_FOUND inside: registers again, does not raise
    assert sync.members["ex1"].model_version == 3


async def test_a_report_while_the_synchronizer_is_unreachable_gives_up_after_the_timeout(synchronizer):
    sync, server, client = synchronizer
    await client.register()
    await server.stop(0)
    await client.report_load(2, True, 0, within_s=0.3)  # UNAVAILABLE until the deadline: logged, not raised
    assert client.model_version == 2  # a later registration carries it


async def test_a_pull_cut_off_by_a_synchronizer_restart_waits_for_the_next_version(synchronizer):
    """The synchronizer offers version 1, then restarts (on the same port) while the explorer pulls:
    the new one has no weights (NOT_FOUND). The gate asks again, registers with the new synchronizer
    and loads version 2 once the trainer pushes it, instead of ending the explorer."""
    import torch

    from services.weight_sync import Receiver
    from services.weight_sync.member.explorer_gate import ExplorerSyncGate

    sync, server, explorer = synchronizer
    port = int(server.address.rsplit(":", 1)[1])
    trainer = SyncClient(create_channel(server.address), "trainer", "trainer", timeout_s=5, owns_channel=True)
    loaded: list[int] = []

    async def load(named, version, strict=True):
        loaded.append(version)

    restarted: list = []
    replaced = asyncio.Event()
    method = sync_method("memory")
    pull = method.fetch(explorer, Receiver(load))

    async def fetch(answer):
        if not restarted:  # the synchronizer is replaced between the offer and the pull
            await server.stop(0)
            fresh = SynchronizerCore(SynchronizerSettings(method=method, plan=SyncPlan("fixed", 1, 1)))
            await fresh.start()
            restarted.append((fresh, await start_server([registration(fresh)], port=port)))
            replaced.set()
        return await pull(answer)

    async def push_when_registered():
        await replaced.wait()
        await restarted[0][0].wait_until(lambda: "ex1" in restarted[0][0].members, 20)
        await trainer.register(step=2)
        await trainer.push_weights({"w": torch.full((4,), 2.0)}, 2, step=2)

    try:
        await explorer.register()
        await trainer.register()
        await trainer.push_weights({"w": torch.ones(4)}, 1, step=1)
        gate = ExplorerSyncGate(explorer, fetch, timeout_s=10, method=method)
        pusher = asyncio.create_task(push_when_registered())
        await asyncio.wait_for(gate.before_step(2, 0), 30)  # step 2 needs version 1: offered, cut off
        await pusher
        await gate.settle()
        assert loaded == [2] and gate.held == 2
        assert restarted[0][0].members["ex1"].model_version == 2
    finally:
        await trainer.close()
        for core, srv in restarted:
            await srv.stop(0)
            await core.close()
