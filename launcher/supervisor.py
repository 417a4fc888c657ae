"""Supervision of one stage's processes: start them in two waves, watch them, restart what fails, stop
them in order. `runner.StageRun` builds the processes; this module knows them only by their process
interface (`ServiceProcess`: port file, gRPC health, exit code, SIGTERM), so its tests run fake services.

Start: the first wave (synchronizer, buffer) answers the gRPC health check before the second (trainer,
explorers) starts, which learns where the first listens as `RFT_<SERVICE>_ADDRESS`. A process that
exits before it was first ready fails the stage at once: a config or environment problem that a
restart would only repeat.

Restart (`services.max_restarts` per process per stage): a process that exits non-zero or is killed
by a signal, or a first-wave process that exits at all, is started again with the same argv and
environment; a first-wave process also gets its old port back (`RFT_<SERVICE>_PORT`), since the second
wave dials it there (gRPC binds with SO_REUSEADDR, so a killed server's port is free again at once).
A background task waits until it answers the health check, so the others stay supervised meanwhile.
A process in `RestartPolicy.restarts_stage` (the buffer on the memory store: its data died with it)
restarts the whole stage instead: `run` stops every process in order and starts both waves again.
With the budget spent the stage fails (`StageFailed` names the process, the first exception its log
holds since its last start, e.g. `ImportError: ...`, and carries its last log lines).

Hung (`services.liveness_timeout`, launcher/watchdog.py): once a process is ready (first, or again after a
restart) a background task asks its `rft.v1.Liveness` every few seconds. One that has not answered for
the window (stopped, wedged, its event loop blocked) is killed (SIGKILL to its process group, torchrun's
ranks included) and then takes the crash path above, budget and stage restart included, with one line:
`explorer hung: no answer for 60 s (last heard on explore step 25); killed and restarted (1/3)`.
A process that answers but says its work is stuck (`services.progress_timeout`: a thread blocked in a
collective, a generate call that never returns, a trainer rank > 0 stopped) is hung too; the stuck
thread's Python stack, as the process reported it, is logged before it is killed.

Each restart's count is written to `run/<name>.restarts` (next to the port file) for `rft top`.

Stop: SIGTERM to the second wave (the trainer flushes its checkpoint while the buffer is still up),
wait, SIGKILL what is left, then the same for the first wave.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.processes import ServiceProcess, describe_exit
from launcher.watchdog import Watchdog

POLL_S = 0.25
EXPLORER_GRACE_S = 60.0
RESTART_STAGE = "restart-stage"


class StageFailed(RuntimeError):
    def __init__(self, service: str, message: str, log_tail: str = "", log_file: Path | None = None):
        super().__init__(f"{service}: {message}")
        self.service, self.message, self.log_tail, self.log_file = service, message, log_tail, log_file


@dataclass(frozen=True)
class RestartPolicy:
    """Restarts allowed per process (`services.max_restarts`), and the processes whose failure
    restarts the whole stage rather than themselves."""

    max_restarts: int = 3
    restarts_stage: frozenset[str] = frozenset()


class Supervisor:
    """The processes of one stage, in start order (`waves[0]` must be healthy before `waves[1]`)."""

    def __init__(
        self,
        waves: list[list[ServiceProcess]],
        label: str,
        policy: RestartPolicy = RestartPolicy(),
        *,
        cwd: Path | None = None,
        ready_timeout_s: float = 600.0,
        stop_timeout_s: float = 120.0,
        on_restart: Callable[[str], None] | None = None,
        liveness_timeout_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.waves, self.label, self.policy, self.cwd = waves, label, policy, cwd
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self.on_restart = on_restart
        self.restarts = {p.name: 0 for p in self.processes}
        for p in self.processes:  # an earlier run's counts
            if p.restarts_file is not None:
                p.restarts_file.unlink(missing_ok=True)
        self._ports: dict[str, int] = {}  # first wave: where the second wave dials it
        self._recovering: dict[str, asyncio.Task[None]] = {}
        self.watchdog = Watchdog(liveness_timeout_s, clock)
        self._probes: dict[str, asyncio.Task[None]] = {}

    @property
    def processes(self) -> list[ServiceProcess]:
        return [p for wave in self.waves for p in wave]

    @property
    def recovering(self) -> list[str]:
        """The processes restarted in place that have not answered the health check yet."""
        return [name for name, task in self._recovering.items() if not task.done()]

    def _say(self, message: str) -> None:
        print(f"[{self.label}] {message}", flush=True)

    def _fail(self, p: ServiceProcess, message: str) -> StageFailed:
        error = p.first_error()
        if error:
            message += f"; its first error: {error}"
        return StageFailed(p.name, message, p.tail(30), p.log_file)

    def _launch(self, p: ServiceProcess, extra_env: dict[str, str] | None = None) -> None:
        p.start(self.cwd, extra_env)
        self._say(f"started {p.name} (pid {p.pid}), log {p.log_file}")

    async def run(
        self,
        stop: asyncio.Event,
        tick: Callable[[], None] | None = None,
        started: Callable[[], None] | None = None,
    ) -> str:
        """Start, supervise (restarting what fails, the whole stage included) until the run ends:
        'finished' or 'interrupted'; raises StageFailed. `started` runs each time both waves are up,
        `tick` every supervision round. The processes are left running: `shutdown()` stops them."""
        while True:
            await self.start(stop)
            if stop.is_set():
                return "interrupted"
            if started is not None:
                started()
            outcome = await self.supervise(stop, tick)
            if outcome != RESTART_STAGE:
                return outcome
            await self.shutdown()

    # ------------------------------------------------------------------ start
    async def start(self, stop: asyncio.Event) -> None:
        """Both waves, each healthy before the next; returns early when `stop` is set."""
        await self._start_wave(self.waves[0], stop)
        if stop.is_set():
            return
        self._peer_env()
        await self._start_wave(self.waves[1], stop)

    async def _start_wave(self, wave: list[ServiceProcess], stop: asyncio.Event) -> None:
        for p in wave:
            self._launch(p)
        pending = list(wave)
        deadline = time.monotonic() + self.ready_timeout_s
        while pending:
            for p in list(pending):
                code = p.poll()
                if code is not None:
                    if code != 0 or not p.finishes_run:
                        raise self._fail(p, f"{describe_exit(code)} before it was ready")
                    pending.remove(p)  # finished already (a tiny run)
                elif await asyncio.to_thread(p.healthy):
                    self._say(f"{p.name} ready at {p.address}")
                    pending.remove(p)
                    self._watch(p)
            if not pending or stop.is_set():
                return
            if time.monotonic() > deadline:
                raise self._fail(pending[0], f"not ready after {self.ready_timeout_s:.0f}s")
            await _wait(stop, POLL_S)

    def _peer_env(self) -> None:
        """Tell the second wave where the first listens (RFT_<SERVICE>_ADDRESS)."""
        for p in self.waves[0]:
            self._ports[p.name] = p.port  # type: ignore[assignment]  # healthy: the port is known
            var = f"RFT_{p.name.upper()}_ADDRESS"
            for q in self.waves[1]:
                q.env = {**q.env, var: p.address}

    # ------------------------------------------------------------------ supervise
    async def supervise(self, stop: asyncio.Event, tick: Callable[[], None] | None = None) -> str:
        """Until the run ends: 'finished', 'interrupted' or RESTART_STAGE; raises StageFailed.
        `tick` runs every round (progress, checks of the caller's own tasks)."""
        finishers = [p for p in self.waves[1] if p.finishes_run]
        trainer_done_at: float | None = None
        while True:
            if tick is not None:
                tick()
            if stop.is_set():
                return "interrupted"
            self._raise_failed_recovery()
            for p in self.processes:
                code = p.poll()
                if code is None or (code == 0 and p.finishes_run):
                    continue
                if self._on_exit(p, code) == RESTART_STAGE:
                    return RESTART_STAGE
            for p in self.processes:
                reason = self.watchdog.hung(p.name) if p.running else None
                if reason is not None and await self._on_hung(p, reason) == RESTART_STAGE:
                    return RESTART_STAGE
            if all(p.poll() == 0 for p in finishers):
                return "finished"
            trainer = next((p for p in finishers if p.name == "trainer"), None)
            if trainer is not None and trainer.poll() == 0:
                trainer_done_at = trainer_done_at or time.monotonic()
                if time.monotonic() - trainer_done_at > EXPLORER_GRACE_S:
                    return "finished"  # the trainer is done; explorers that did not notice are stopped
            await _wait(stop, POLL_S)

    async def _on_hung(self, p: ServiceProcess, reason: str) -> str | None:
        """`p` stopped answering (or its work stopped moving): SIGKILL it, then handle it as a crash."""
        stack = self.watchdog.stack(p.name)
        if stack:
            self._say(f"{p.name} stuck thread's stack (as it reported it):\n{stack.rstrip()}")
        self._unwatch(p.name)
        p.kill()
        code = await asyncio.to_thread(p.wait, 30.0)
        return self._on_exit(p, -9 if code is None else code, hung=reason)

    def _on_exit(self, p: ServiceProcess, code: int, hung: str | None = None) -> str | None:
        """`p` ended when it should not have (or was killed as `hung`): restart it (or ask for the
        stage's restart), or fail."""
        if hung is not None:
            what = f"hung: {hung}; killed"
        else:
            what = describe_exit(code) + ("" if code else " while the run was still going")
        used, budget = self.restarts[p.name], self.policy.max_restarts
        self._cancel_recovery(p.name)
        self._unwatch(p.name)
        if used >= budget:
            spent = f"; restarted {used} times already (services.max_restarts: {budget})" if budget else ""
            raise self._fail(p, what + spent)
        self.restarts[p.name] = used + 1
        if p.restarts_file is not None:
            with contextlib.suppress(OSError):
                p.restarts_file.write_text(f"{used + 1}\n")
        count = f"({used + 1}/{budget})"
        if self.on_restart is not None:
            self.on_restart(p.name)
        if p.name in self.policy.restarts_stage:
            self._say(f"{p.name} {what}; restarting the stage {count}: its in-memory data died with it")
            return RESTART_STAGE
        self._say(
            f"{p.name} {what} and restarted {count}" if hung else f"{p.name} {what}; restarting {count}"
        )
        port = self._ports.get(p.name)
        self._launch(p, {f"RFT_{p.name.upper()}_PORT": str(port)} if port is not None else None)
        self._recovering[p.name] = asyncio.create_task(self._await_ready(p, count, port))
        return None

    async def _await_ready(self, p: ServiceProcess, count: str, port: int | None) -> None:
        """Wait until a restarted process answers the health check; an exit is `supervise`'s to see."""
        deadline = time.monotonic() + self.ready_timeout_s
        while p.poll() is None:
            if await asyncio.to_thread(p.healthy):
                if port is not None and p.port != port:
                    raise self._fail(p, f"came back on port {p.port}, not {port} where the others dial it")
                self._say(f"{p.name} ready at {p.address} after restart {count}")
                self._watch(p)
                return
            if time.monotonic() > deadline:
                raise self._fail(p, f"not ready {self.ready_timeout_s:.0f}s after restart {count}")
            await asyncio.sleep(POLL_S)  # ok-sleep: polling the health check with a deadline

    def _raise_failed_recovery(self) -> None:
        for name, task in list(self._recovering.items()):
            if task.done():
                del self._recovering[name]
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]

    def _cancel_recovery(self, name: str) -> None:
        task = self._recovering.pop(name, None)
        if task is not None:
            task.cancel()

    # ------------------------------------------------------------------ liveness
    def _watch(self, p: ServiceProcess) -> None:
        """`p` is ready: ask it for its liveness from now on (when `services.liveness_timeout` > 0)."""
        if not self.watchdog.enabled:
            return
        self._unwatch(p.name)
        self.watchdog.watch(p.name)
        self._probes[p.name] = asyncio.create_task(self._probe(p), name=f"liveness-{p.name}")

    def _unwatch(self, name: str) -> None:
        self.watchdog.forget(name)
        task = self._probes.pop(name, None)
        if task is not None:
            task.cancel()

    async def _probe(self, p: ServiceProcess) -> None:
        """Ask `p` for its liveness while it runs, on one connection; each outcome goes to the watchdog."""
        deadline = self.watchdog.probe_deadline_s
        try:
            channel = p.channel(deadline)
        except Exception as exc:  # e.g. unreadable TLS files: a fault of the check, not of the service
            self._not_watched(p, exc)
            return
        try:
            while p.running:
                try:
                    answer = await p.progress(channel, deadline)
                except Exception as exc:  # a fault of the check itself must never get a service killed
                    self._not_watched(p, exc)
                    return
                if answer is None:
                    self.watchdog.unanswered(p.name)
                else:
                    self.watchdog.answered(p.name, answer)
                await asyncio.sleep(self.watchdog.probe_interval_s)  # ok-sleep: the probe's period
        finally:
            await channel.close()

    def _not_watched(self, p: ServiceProcess, exc: Exception) -> None:
        self._say(f"{p.name}: its liveness cannot be checked ({type(exc).__name__}: {exc}); not watching it")
        self.watchdog.forget(p.name)

    # ------------------------------------------------------------------ stop
    async def _stop_wave(self, wave: list[ServiceProcess]) -> None:
        running = [p for p in wave if p.running]
        for p in running:
            p.terminate()
        deadline = time.monotonic() + self.stop_timeout_s
        for p in running:
            if await asyncio.to_thread(p.wait, max(0.0, deadline - time.monotonic())) is None:
                self._say(f"{p.name} did not stop in {self.stop_timeout_s:.0f}s; killing it")
                p.kill()
                await asyncio.to_thread(p.wait, 10.0)

    async def shutdown(self) -> None:
        """Stop every process in order: the second wave, then the first."""
        for name in list(self._recovering):
            self._cancel_recovery(name)
        for name in list(self._probes):
            self._unwatch(name)
        await self._stop_wave(self.waves[1])
        await self._stop_wave(self.waves[0])

    def kill_all(self) -> None:
        for p in self.processes:
            p.kill()


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Wait up to `timeout_s`, returning early when `event` is set (the supervision tick)."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=timeout_s)
