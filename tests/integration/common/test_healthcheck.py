"""The compose health probe (`python -m services.common.healthcheck HOST:PORT`) against a real grpc.aio
server: 0 while SERVING (also with a bearer token on, since health stays open), 1 once the server says
NOT_SERVING (also when the service's work is stuck: services/common/progress.py), and 1 when nothing
listens."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from grpc_health.v1 import health_pb2
from rft.v1 import buffer_pb2_grpc

from services.common.app import health_follows_work
from services.common.healthcheck import main
from services.common.liveness import Liveness
from services.common.progress import Tracker
from services.common.rpc import start_server
from services.weight_sync import free_port

ROOT = Path(__file__).resolve().parents[3]
SERVICE = "rft.v1.BufferService"


async def _start(**kw):
    servicer = buffer_pb2_grpc.BufferServiceServicer()
    return await start_server(
        [(buffer_pb2_grpc.add_BufferServiceServicer_to_server, servicer, SERVICE)], **kw
    )


async def test_probe_follows_the_serving_status(capsys):
    handle = await _start(auth_token="s3cret")
    try:
        assert await asyncio.to_thread(main, [handle.address]) == 0
        assert await asyncio.to_thread(main, [handle.address, "--service", SERVICE]) == 0
        assert f"{handle.address}: SERVING" in capsys.readouterr().out
        await handle.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await asyncio.to_thread(main, [handle.address]) == 1
        assert "NOT_SERVING" in capsys.readouterr().out
        # A service the server does not know is a failure, not a pass.
        assert await asyncio.to_thread(main, [handle.address, "--service", "rft.v1.Nope"]) == 1
        assert "NOT_FOUND" in capsys.readouterr().err
    finally:
        await handle.stop(0)


async def test_probe_fails_when_nothing_listens(capsys):
    address = f"127.0.0.1:{free_port()}"
    assert await asyncio.to_thread(main, [address, "--timeout", "0.5"]) == 1
    err = capsys.readouterr().err
    assert address in err and ("UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err)


async def test_module_entry_point_as_the_compose_healthcheck_runs_it():
    handle = await _start()
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "protos")])}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.common.healthcheck", handle.address,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
        assert out.decode().strip() == f"{handle.address}: SERVING"
    finally:
        await handle.stop(0)


async def test_probe_fails_while_the_work_is_stuck_and_passes_once_it_moves(capsys):
    """The decision the compose healthcheck and the Kubernetes probe take on a wedged service: its loop
    answers, but a unit of work past its limit (services/common/progress.py) flips health to NOT_SERVING."""
    clock = [0.0]
    live = Liveness(lambda: clock[0])
    live.tracker = Tracker(5, lambda: clock[0])
    handle = await _start()
    task = live.start(health_follows_work(handle))
    try:
        with live.tracker.work("generate call"):
            await live._judge()
            assert await asyncio.to_thread(main, [handle.address]) == 0
            clock[0] += 6
            await live._judge()
            assert await asyncio.to_thread(main, [handle.address]) == 1
            assert "NOT_SERVING" in capsys.readouterr().out
        await live._judge()
        assert await asyncio.to_thread(main, [handle.address]) == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await handle.stop(0)
