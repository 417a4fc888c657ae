"""`rft run`'s supervisor telling hung services, with real child processes (fake services on the real
skeleton, which serves `rft.v1.Liveness`): a SIGSTOPped first-wave service is SIGKILLed and comes back on
its port, a SIGSTOPped second-wave one comes back anywhere, each with one `hung` line; a process that
answers is never killed however long it makes no progress; with the budget spent the stage fails
naming the hung service."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launcher.processes import ServiceProcess
from launcher.supervisor import RestartPolicy, StageFailed, Supervisor

ROOT = Path(__file__).resolve().parents[3]
ENV = {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}", "PYTHONUNBUFFERED": "1"}
WINDOW_S = 6.0


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("services:\n  buffer: {store: memory}\nlog: {format: json}\n")
    return path


def _process(tmp_path: Path, config: Path, service: str, *flags: str) -> ServiceProcess:
    port_file = tmp_path / "run" / f"{service}.port"
    return ServiceProcess(
        name=service,
        argv=[sys.executable, "-m", "tests.support.fake_service", service, *flags,
              "--config", str(config), "--port-file", str(port_file)],
        log_file=tmp_path / "log" / f"{service}.log",
        port_file=port_file,
        env=dict(ENV),
        finishes_run=service in ("trainer", "explorer"),
    )  # fmt: skip


def _supervisor(waves: list[list[ServiceProcess]], max_restarts: int) -> Supervisor:
    return Supervisor(
        waves, "t", RestartPolicy(max_restarts), cwd=ROOT, ready_timeout_s=60, stop_timeout_s=15,
        liveness_timeout_s=WINDOW_S,
    )  # fmt: skip


async def _until(check: Callable[[], Any], task: asyncio.Task[Any], what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if task.done():
            raise AssertionError(f"supervision ended ({task.result()!r}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)  # ok-sleep: polling with a deadline
    return value


def _resume(*processes: ServiceProcess) -> None:
    """SIGCONT whatever a failed test left stopped, so the shutdown's SIGTERM works."""
    for p in processes:
        if p.running:
            os.kill(p.pid, signal.SIGCONT)  # type: ignore[arg-type]


async def test_stopped_services_are_killed_and_restarted_in_place(tmp_path, config, capsys):
    finish = tmp_path / "finish"
    sync = _process(tmp_path, config, "synchronizer")
    trainer = _process(tmp_path, config, "trainer", "--finish-file", str(finish))
    sup = _supervisor([[sync], [trainer]], max_restarts=3)
    stop = asyncio.Event()
    try:
        await sup.start(stop)
        port, sync_pid, trainer_pid = sync.port, sync.pid, trainer.pid
        task = asyncio.create_task(sup.supervise(stop))
        # both answer: no progress at all for two windows is not a hang
        await _until(lambda: sup.watchdog.watched == ["synchronizer", "trainer"], task, "both watched")
        await asyncio.wait([task], timeout=2 * WINDOW_S)
        assert sup.restarts == {"synchronizer": 0, "trainer": 0} and sync.pid == sync_pid

        stopped_at = time.monotonic()
        os.kill(sync_pid, signal.SIGSTOP)  # never resumed
        await _until(lambda: sync.pid != sync_pid and not sup.recovering, task, "the synchronizer back")
        took = time.monotonic() - stopped_at
        # the silence counts from the last answer, which came up to one probe interval before the stop
        earliest = WINDOW_S - sup.watchdog.probe_interval_s
        assert earliest <= took < 4 * WINDOW_S + 10, took
        assert sync.port == port and sync.running  # the second wave dials it there

        os.kill(trainer_pid, signal.SIGSTOP)
        await _until(lambda: trainer.pid != trainer_pid and not sup.recovering, task, "the trainer back")
        assert sup.restarts == {"synchronizer": 1, "trainer": 1}

        finish.touch()
        assert await asyncio.wait_for(task, 30) == "finished"
    finally:
        _resume(sync, trainer)
        await sup.shutdown()
    assert not any(p.running for p in sup.processes)
    out = capsys.readouterr().out
    assert re.search(r"\[t\] synchronizer hung: no answer for \d+ s; killed and restarted \(1/3\)", out), out
    assert f"[t] synchronizer ready at 127.0.0.1:{port} after restart (1/3)" in out
    assert re.search(r"\[t\] trainer hung: no answer for \d+ s; killed and restarted \(1/3\)", out), out
    assert out.count("hung:") == 2, out


async def test_a_hung_service_with_its_budget_spent_fails_the_stage(tmp_path, config, capsys):
    sync = _process(tmp_path, config, "synchronizer")
    trainer = _process(tmp_path, config, "trainer")
    sup = _supervisor([[sync], [trainer]], max_restarts=0)
    stop = asyncio.Event()
    try:
        await sup.start(stop)
        os.kill(trainer.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        with pytest.raises(StageFailed) as info:
            await asyncio.wait_for(sup.supervise(stop), 60)
    finally:
        _resume(sync, trainer)
        await sup.shutdown()
    assert not any(p.running for p in sup.processes)
    assert info.value.service == "trainer"
    assert re.fullmatch(r"hung: no answer for \d+ s; killed", info.value.message), info.value.message


async def test_a_hung_memory_store_buffer_restarts_the_whole_stage(tmp_path, config, capsys):
    """Its experiences die with it, as when it crashes: every process stops in order and starts again."""
    finish = tmp_path / "finish"
    sync = _process(tmp_path, config, "synchronizer")
    buffer = _process(tmp_path, config, "buffer")
    trainer = _process(tmp_path, config, "trainer", "--finish-file", str(finish))
    sup = Supervisor(
        [[sync, buffer], [trainer]], "t", RestartPolicy(3, frozenset({"buffer"})), cwd=ROOT,
        ready_timeout_s=60, stop_timeout_s=15, liveness_timeout_s=WINDOW_S,
    )  # fmt: skip
    stop = asyncio.Event()
    starts: list[dict[str, int | None]] = []
    task = asyncio.create_task(
        sup.run(stop, started=lambda: starts.append({p.name: p.pid for p in sup.processes}))
    )
    try:
        await _until(lambda: starts, task, "the stage to start")
        os.kill(buffer.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        await _until(lambda: len(starts) == 2, task, "the stage to start again")
        first, second = starts
        assert all(first[name] != second[name] for name in first)  # every process is new
        assert sup.restarts == {"synchronizer": 0, "buffer": 1, "trainer": 0}
        finish.touch()
        assert await asyncio.wait_for(task, 30) == "finished"
    finally:
        _resume(sync, buffer, trainer)
        stop.set()
        await asyncio.wait([task], timeout=30)
        await sup.shutdown()
    assert not any(p.running for p in sup.processes)
    out = capsys.readouterr().out
    assert re.search(r"\[t\] buffer hung: no answer for \d+ s; killed; restarting the stage \(1/3\)", out), (
        out
    )


async def test_a_stopped_service_asked_to_stop_stops_gracefully(tmp_path, config):
    """`rft run` stopping (Ctrl-C) while a service is stopped: SIGTERM then SIGCONT, so it runs its
    graceful stop (the trainer's last save) instead of waiting out the stop timeout for SIGKILL."""
    events = tmp_path / "events"
    p = _process(tmp_path, config, "trainer", "--events", str(events))
    p.start(ROOT)
    try:
        deadline = time.monotonic() + 60
        while not await asyncio.to_thread(p.healthy):
            assert p.running and time.monotonic() < deadline, p.tail()
            await asyncio.sleep(0.1)  # ok-sleep: polling the health check with a deadline
        os.kill(p.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        p.terminate()
        assert await asyncio.to_thread(p.wait, 30) == 0, p.tail()
    finally:
        p.kill()
    assert events.read_text().split()[-3:-1] == ["trainer", "stopped"], events.read_text()


async def test_a_generate_call_wedged_on_a_lock_held_by_a_stopped_helper_is_found_and_replaced(
    tmp_path, capsys
):
    """A real wedge, not a flag: the explorer's generate calls share a multiprocessing lock with a helper
    process, which takes it and stops (SIGSTOP). The explorer's event loop keeps answering its liveness
    check, but its generate call does not move past `services.progress_timeout`: it is found hung, the
    stuck thread's stack is logged (blocked on the lock), and it is killed with its helper and restarted."""
    config = tmp_path / "config.yaml"
    config.write_text("services:\n  buffer: {store: memory}\n  progress_timeout: 3\nlog: {format: json}\n")
    finish, wedge = tmp_path / "finish", tmp_path / "wedge"
    sync = _process(tmp_path, config, "synchronizer")
    explorer = _process(
        tmp_path, config, "explorer", "--finish-file", str(finish), "--wedge-file", str(wedge)
    )
    sup = _supervisor([[sync], [explorer]], max_restarts=3)
    stop = asyncio.Event()
    try:
        await sup.start(stop)
        first_pid = explorer.pid
        task = asyncio.create_task(sup.supervise(stop))
        await _until(lambda: sup.watchdog.watched == ["synchronizer", "explorer"], task, "both watched")
        await asyncio.wait([task], timeout=4)  # its generate calls move: more than the floor is no hang
        assert sup.restarts == {"synchronizer": 0, "explorer": 0} and explorer.pid == first_pid
        helper = int(await _until(lambda: Path(f"{wedge}.pid").is_file() and Path(f"{wedge}.pid").read_text(),
                                  task, "the helper's pid"))  # fmt: skip
        Path(f"{wedge}.pid").unlink()
        wedged_at = time.monotonic()
        wedge.touch()  # the helper takes the lock and stops; the explorer's next call blocks on it
        await _until(lambda: explorer.pid != first_pid and not sup.recovering, task, "the explorer back")
        took = time.monotonic() - wedged_at
        assert sup.restarts == {"synchronizer": 0, "explorer": 1}
        assert (
            not Path(f"/proc/{helper}").exists() or "Z" in Path(f"/proc/{helper}/stat").read_text().split()[2]
        )
        wedge.unlink()  # the new explorer's helper does not stop
        finish.touch()
        assert await asyncio.wait_for(task, 30) == "finished"
    finally:
        _resume(sync, explorer)
        await sup.shutdown()
    out = capsys.readouterr().out
    found = re.search(
        r"\[t\] explorer hung: its event loop answers but its work does not move: generate call has not moved "
        r"for (\d+) s \(limit 3 s\); killed and restarted \(1/3\)", out
    )  # fmt: skip
    assert found, out
    stack = out[out.index("[t] explorer stuck thread's stack") : found.start()]
    assert "_generate_calls" in stack and "with progress.work" in stack, stack
    assert 3 <= took < 3 + 2 * WINDOW_S, took
    print(f"wedge found and replaced in {took:.1f} s")
