"""The service-backed mode's edges without a model: `Publisher` against a real synchronizer (gRPC on a
free port) publishes state dicts as consecutive versions, and a restarted one goes on from the run's
version; a broadcast method and a plan that refuses a publish fail with what to change; a sample
waiting for a version the explorer never loads fails naming both versions."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from pathlib import Path

import pytest
import torch

from services.common.config.sync_plan import SyncPlan
from services.common.rpc import start_server
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.servicer import registration
from services.synchronizer.settings import SynchronizerSettings
from services.weight_sync import sync_method
from tinker_api.explorer_sampler import ExplorerError, ExplorerSampler
from tinker_api.publish import Publisher, PublishError

STATE = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}


async def _synchronizer(method: str, interval: int = 1):
    core = SynchronizerCore(
        SynchronizerSettings(method=sync_method(method), plan=SyncPlan("fixed", interval, 0), sync_timeout=10)
    )
    await core.start()
    return core, await start_server([registration(core)], port=0)


async def test_versions_follow_one_another_across_a_restart(tmp_path: Path) -> None:
    core, server = await _synchronizer("memory")
    try:
        pub = await asyncio.to_thread(Publisher, server.address, tmp_path)
        assert [await asyncio.to_thread(pub.publish, STATE) for _ in range(2)] == [1, 2]
        assert core.published.version == 2 and core.weights is not None
        await asyncio.to_thread(pub.close)
        again = await asyncio.to_thread(Publisher, server.address, tmp_path)  # the same trainer member
        assert again.version == 2 and await asyncio.to_thread(again.publish, STATE) == 3
        await asyncio.to_thread(again.close)
    finally:
        await server.stop(0)
        await core.close()


async def test_a_broadcast_method_or_a_refusing_plan_says_what_to_change(tmp_path: Path) -> None:
    core, server = await _synchronizer("nccl")
    try:
        with pytest.raises(PublishError, match="sync_method: memory or checkpoint"):
            await asyncio.to_thread(Publisher, server.address, tmp_path)
    finally:
        await server.stop(0)
        await core.close()
    core, server = await _synchronizer("checkpoint", interval=2)
    try:
        pub = await asyncio.to_thread(Publisher, server.address, tmp_path)
        with pytest.raises(PublishError, match=r"fixed plan has no sync after step 1.*sync_interval: 1"):
            await asyncio.to_thread(pub.publish, STATE)
        assert core.published.version == 0
        await asyncio.to_thread(pub.close)
    finally:
        await server.stop(0)
        await core.close()


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"status": "ok", "model_version": 0}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


async def test_a_sample_waits_for_its_version_with_a_deadline(tmp_path: Path) -> None:
    core, server = await _synchronizer("memory")
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)  # an explorer that never loads
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        pub = await asyncio.to_thread(Publisher, server.address, tmp_path)
        url = f"http://127.0.0.1:{web.server_address[1]}/v1"
        sampler = ExplorerSampler(pub, url, "base-folder", wait_s=0.3)
        assert sampler.wait_for(0) < 0.3  # nothing published: the explorer's base model
        version = await asyncio.to_thread(pub.publish, STATE)
        with pytest.raises(ExplorerError, match=r"still holds version 0 .* waiting for version 1"):
            await asyncio.to_thread(sampler.wait_for, version)
        await asyncio.to_thread(sampler.close)
    finally:
        web.shutdown()
        web.server_close()
        await server.stop(0)
        await core.close()
