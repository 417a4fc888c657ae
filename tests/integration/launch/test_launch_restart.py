"""`rft run`'s supervisor restarting failed services, with real child processes: fake services on the
real service skeleton (tests/support/fake_service.py: port file, gRPC health, SIGTERM) and the real
buffer. A SIGKILLed first-wave service comes back on its port (a client of the old one reaches the new
one), a second-wave one anywhere; a spent budget fails the stage naming the service with its log; a
memory-store buffer failure stops every process in order and starts the whole stage again."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from launcher.processes import ServiceProcess
from launcher.supervisor import RestartPolicy, StageFailed, Supervisor

ROOT = Path(__file__).resolve().parents[3]
ENV = {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}", "PYTHONUNBUFFERED": "1"}
KILLED = "exited with code -9 (killed by SIGKILL)"


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("services:\n  buffer: {store: memory}\nlog: {format: json}\n")
    return path


def _process(tmp_path: Path, config: Path, service: str, *flags: str, real: bool = False) -> ServiceProcess:
    port_file = tmp_path / "run" / f"{service}.port"
    module = f"services.{service}" if real else "tests.support.fake_service"
    head = [sys.executable, "-m", module] + ([] if real else [service, "--events", str(tmp_path / "events")])
    return ServiceProcess(
        name=service,
        argv=[*head, *flags, "--config", str(config), "--port-file", str(port_file)],
        log_file=tmp_path / "log" / f"{service}.log",
        port_file=port_file,
        env=dict(ENV),
        finishes_run=service in ("trainer", "explorer"),
    )


def _supervisor(waves: list[list[ServiceProcess]], policy: RestartPolicy, **kw: Any) -> Supervisor:
    return Supervisor(waves, "t", policy, cwd=ROOT, ready_timeout_s=60, stop_timeout_s=15, **kw)


async def _until(check: Callable[[], Any], task: asyncio.Task[Any], what: str, timeout_s: float = 30) -> Any:
    """Poll `check` until truthy; fail at the deadline, or at once if the supervising task ended."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if task.done():
            raise AssertionError(f"supervision ended ({task.result()!r}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)  # ok-sleep: polling with a deadline
    return value


async def _serving(channel: grpc.aio.Channel) -> bool:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=15, wait_for_ready=True)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _events(tmp_path: Path) -> list[tuple[str, str, int]]:
    lines = (tmp_path / "events").read_text().splitlines()
    return [(name, verb, int(pid)) for name, verb, pid in (line.split() for line in lines)]


async def test_a_killed_service_restarts_and_the_buffer_keeps_its_port(tmp_path, config, capsys):
    finish = tmp_path / "finish"
    sync = _process(tmp_path, config, "synchronizer")
    buffer = _process(tmp_path, config, "buffer", real=True)
    trainer = _process(tmp_path, config, "trainer", "--finish-file", str(finish))
    sup = _supervisor([[sync, buffer], [trainer]], RestartPolicy(max_restarts=3))
    stop = asyncio.Event()
    try:
        await sup.start(stop)
        port, first_pid = buffer.port, buffer.pid
        assert trainer.env["RFT_BUFFER_ADDRESS"] == f"127.0.0.1:{port}"
        task = asyncio.create_task(sup.supervise(stop))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:  # a client, as the trainer
            assert await _serving(channel)
            os.kill(buffer.pid, signal.SIGKILL)
            await _until(lambda: buffer.pid != first_pid and sup.restarts["buffer"] == 1 and not sup.recovering,
                         task, "the buffer to come back")  # fmt: skip
            assert buffer.port == port and buffer.running
            assert await _serving(channel)  # the address the second wave got still works

        trainer_pid = trainer.pid
        os.kill(trainer.pid, signal.SIGKILL)  # a second-wave process may come back on any port
        await _until(
            lambda: trainer.pid != trainer_pid and not sup.recovering, task, "the trainer to come back"
        )
        assert (
            trainer.running
            and sync.running
            and sup.restarts == {"synchronizer": 0, "buffer": 1, "trainer": 1}
        )
        run = tmp_path / "run"  # what `rft top` reads: one file per restarted process
        assert sorted(p.name for p in run.glob("*.restarts")) == ["buffer.restarts", "trainer.restarts"]
        assert (run / "buffer.restarts").read_text() == (run / "trainer.restarts").read_text() == "1\n"

        finish.touch()
        assert await asyncio.wait_for(task, 30) == "finished"
    finally:
        await sup.shutdown()
    assert not any(p.running for p in sup.processes)
    out = capsys.readouterr().out
    assert f"[t] buffer {KILLED}; restarting (1/3)" in out
    assert f"[t] buffer ready at 127.0.0.1:{port} after restart (1/3)" in out
    assert f"[t] trainer {KILLED}; restarting (1/3)" in out


async def test_a_spent_budget_fails_the_stage_naming_the_service(tmp_path, config, capsys):
    crash = tmp_path / "crash"
    sync = _process(tmp_path, config, "synchronizer")
    trainer = _process(tmp_path, config, "trainer", "--crash-file", str(crash))
    sup = _supervisor([[sync], [trainer]], RestartPolicy(max_restarts=2))
    stop = asyncio.Event()
    try:
        await sup.start(stop)
        (tmp_path / "crash.tmp").write_text("3")
        (tmp_path / "crash.tmp").replace(crash)  # every start of the trainer from now on crashes
        with pytest.raises(StageFailed) as info:
            await asyncio.wait_for(sup.supervise(stop), 60)
    finally:
        await sup.shutdown()
    assert not any(p.running for p in sup.processes)
    failure = info.value
    assert failure.service == "trainer" and failure.log_file == trainer.log_file
    assert failure.message == "exited with code 3; restarted 2 times already (services.max_restarts: 2)"
    assert "crashing with code 3" in failure.log_tail
    out = capsys.readouterr().out
    assert "[t] trainer exited with code 3; restarting (1/2)" in out
    assert "[t] trainer exited with code 3; restarting (2/2)" in out
    assert sup.restarts == {"synchronizer": 0, "trainer": 2}


async def test_a_first_wave_service_that_exits_at_all_counts_as_failed(tmp_path, config, capsys):
    finish = tmp_path / "sync-finish"
    sync = _process(tmp_path, config, "synchronizer", "--finish-file", str(finish))
    trainer = _process(tmp_path, config, "trainer")
    sup = _supervisor([[sync], [trainer]], RestartPolicy(max_restarts=0))
    stop = asyncio.Event()
    try:
        await sup.start(stop)
        finish.touch()  # exits 0 while the run is still going
        with pytest.raises(StageFailed) as info:
            await asyncio.wait_for(sup.supervise(stop), 30)
    finally:
        await sup.shutdown()
    assert (info.value.service, info.value.message) == (
        "synchronizer",
        "exited with code 0 while the run was still going",
    )
    assert "restarting" not in capsys.readouterr().out


async def test_a_memory_store_buffer_failure_restarts_the_whole_stage(tmp_path, config, capsys):
    finish = tmp_path / "finish"
    sync = _process(tmp_path, config, "synchronizer")
    buffer = _process(tmp_path, config, "buffer")
    trainer = _process(tmp_path, config, "trainer", "--finish-file", str(finish))
    restarted: list[str] = []
    sup = _supervisor([[sync, buffer], [trainer]], RestartPolicy(3, frozenset({"buffer"})),
                      on_restart=restarted.append)  # fmt: skip
    stop = asyncio.Event()
    starts: list[dict[str, int | None]] = []
    task = asyncio.create_task(
        sup.run(stop, started=lambda: starts.append({p.name: p.pid for p in sup.processes}))
    )
    try:
        await _until(lambda: starts, task, "the stage to start")
        os.kill(buffer.pid, signal.SIGKILL)
        await _until(lambda: len(starts) == 2, task, "the stage to start again")
        first, second = starts
        assert all(first[name] != second[name] for name in first)  # every process is new
        assert trainer.env["RFT_BUFFER_ADDRESS"] == buffer.address  # the second wave dials the new buffer
        assert sup.restarts == {"synchronizer": 0, "buffer": 1, "trainer": 0} and restarted == ["buffer"]

        events = _events(tmp_path)
        at = {(name, verb, pid): i for i, (name, verb, pid) in enumerate(events)}
        # stopped in order (the trainer saves on SIGTERM while the synchronizer is still up), then started
        # in waves again
        assert (
            at["trainer", "stopped", first["trainer"]] < at["synchronizer", "stopped", first["synchronizer"]]
        )
        assert ("buffer", "stopped", first["buffer"]) not in at  # it was killed
        assert (
            at["synchronizer", "stopped", first["synchronizer"]]
            < at["synchronizer", "started", second["synchronizer"]]
        )
        assert max(at["synchronizer", "started", second["synchronizer"]], at["buffer", "started", second["buffer"]]) < at[
            "trainer", "started", second["trainer"]]  # fmt: skip

        finish.touch()
        assert await asyncio.wait_for(task, 30) == "finished"
    finally:
        stop.set()
        await asyncio.wait([task], timeout=30)
        await sup.shutdown()
    assert not any(p.running for p in sup.processes)
    assert f"[t] buffer {KILLED}; restarting the stage (1/3)" in capsys.readouterr().out
