"""The buffer's Redis cannot write its append-only file (its disk, a real 16 MiB tmpfs, is full): a put is
refused with UNAVAILABLE saying so, nothing of it is stored (not accepted, not leased), and once space
returns puts are stored again (a client retries a refused put with its sequence number, so it is stored
once). Needs root to
mount the tmpfs; skips loudly otherwise."""

from __future__ import annotations

import os
import subprocess
import uuid

import grpc
import pytest

from services.buffer.core import BufferCore
from services.buffer.redis_store import RedisStore
from services.buffer.servicer import SERVICE_NAME, BufferServicer, add_to_server
from services.buffer.settings import BufferSettings
from services.common.buffer_client import BufferClient
from services.common.rpc import create_channel, start_server
from tests.support.buffer_data import batch, group
from tests.support.redis_server import RedisServer, find_redis_server, free_port, require_redis_server


@pytest.fixture(params=["everysec", "always"])
def redis_on_small_disk(tmp_path, request):
    require_redis_server()
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(
            f"!!! cannot mount a small tmpfs ({done.stderr.strip()}): the Redis full-disk test is SKIPPED"
        )
    server = RedisServer(port=free_port(), directory=disk, appendonly=True, binary=find_redis_server(),
                         appendfsync=request.param)  # fmt: skip
    server.launch()
    try:
        yield server, disk
    finally:
        server.stop()
        subprocess.run(["umount", "-l", str(disk)], check=False)


async def test_a_put_to_a_redis_that_cannot_write_its_aof_is_refused_clearly_and_stored_once_later(
    redis_on_small_disk,
):
    server, disk = redis_on_small_disk  # everysec: compose's policy; always: the manifests' and the tests'
    store = RedisStore(server.url, capacity=100_000, prefix=f"t-{uuid.uuid4().hex[:8]}")
    await store.start(("default",))
    handle = await start_server(
        [(add_to_server, BufferServicer(BufferCore(store, BufferSettings())), SERVICE_NAME)]
    )
    channel = create_channel(handle.address, timeout_s=10)
    try:
        client = BufferClient(
            channel, producer_id="p", consumer_group="default", consumer="t", retry_deadline_s=0
        )
        await client.put_proto(batch(group("a", 2)))
        st = os.statvfs(disk)
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (st.f_bavail * st.f_frsize))  # nothing left for the next AOF write
        # a long response fills more than the AOF's last page (a write into it would still fit); with
        # everysec the write that first fails was already answered (Redis keeps it and writes it later, the
        # policy's one-second window), so the refusal comes with a following put
        accepted, refused = 2, None
        for n in range(5):
            try:
                await client.put_proto(batch(group(f"b{n}", 2, response=8192)))
                accepted += 2
            except grpc.aio.AioRpcError as exc:
                refused = exc
                break
        assert refused is not None, "Redis never refused a write on a full disk"
        assert accepted <= 4, accepted  # at most the one put answered before its write failed
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused.details()
        details = refused.details()
        ballast.unlink()  # space returns
        if server.appendfsync == "everysec":
            assert "buffer store cannot write: Redis refuses writes (MISCONF" in details, details
            assert "nothing of this call was stored" in details, details
        else:
            assert "buffer store unavailable" in details, details
            assert server.process is not None and server.process.wait(10) != 0  # Redis stopped itself
            server.launch()  # its restart policy
        stats = await client.stats()
        assert stats.accepted == accepted, stats  # what was acknowledged, and nothing of the refused put
        # once Redis has written its AOF again, puts are stored
        client.retry_deadline_s = 60  # a put refused meanwhile is retried (same sequence number)
        await client.put_proto(batch(group("c", 2)))
        stats = await client.stats()
        assert stats.accepted == accepted + 2, stats
    finally:
        await channel.close()
        await handle.stop(0)
        await store.close()
