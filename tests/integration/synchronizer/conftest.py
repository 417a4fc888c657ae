"""Fixtures of the synchronizer integration tests: a real `grpc.aio` server on port 0 around a
`SynchronizerCore` with the settings a test asks for, and `SyncClient`s connected to it."""

from __future__ import annotations

import pytest

from services.common.config.sync_plan import SyncPlan
from services.common.rpc import create_channel, start_server
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.servicer import registration
from services.synchronizer.settings import SynchronizerSettings
from services.weight_sync import sync_method
from services.weight_sync.member.client import SyncClient


@pytest.fixture
async def sync_server():
    """`await sync_server(method=..., style=..., ...)` -> (core, address); stopped after the test."""
    started = []

    async def start(method="memory", style="fixed", interval=1, offset=0, **kw):
        core = SynchronizerCore(
            SynchronizerSettings(method=sync_method(method), plan=SyncPlan(style, interval, offset), **kw)
        )
        await core.start()
        handle = await start_server([registration(core)], port=0)
        started.append((core, handle))
        return core, handle.address

    yield start
    for core, handle in started:
        await handle.stop(0)
        await core.close()


@pytest.fixture
async def sync_clients():
    """`make(target, member_id, role, **kw)` -> a registered `SyncClient`; closed after the test."""
    made: list[SyncClient] = []

    async def make(target: str, member_id: str, role: str, register: bool = True, **kw) -> SyncClient:
        channel = create_channel(target, timeout_s=10)
        client = SyncClient(
            channel, member_id, role, timeout_s=10, sync_timeout_s=20, owns_channel=True, **kw
        )
        if register:
            await client.register()
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()
