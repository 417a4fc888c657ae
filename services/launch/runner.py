"""Runs one stage as local processes, start to end: first wave (synchronizer, buffer) healthy, then
the second (trainer, explorers), then supervise until the run ends itself, then stop everything.

The stage is over when every process that ends the run (trainer; explorers; in bench mode the
explorer) has exited 0; the trainer ending first gives the explorers `EXPLORER_GRACE_S` to see the
run finished and stop. Any process exiting non-zero, or a first-wave service exiting at all, fails
the stage (`StageFailed` names it and carries its last log lines). A stop request (SIGINT/SIGTERM of
`rft run`) stops the stage: SIGTERM to the second wave (the trainer flushes its checkpoint while the
buffer is still up), wait, SIGKILL what is left, then the same for the first wave.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.common.config import resolve
from services.launch.plan import WAVES, Stage, child_env, effective_tree, service_argv, write_config
from services.launch.processes import ServiceProcess
from services.launch.progress import Progress

POLL_S = 0.25
EXPLORER_GRACE_S = 60.0


class StageFailed(RuntimeError):
    def __init__(self, service: str, message: str, log_tail: str = "", log_file: Path | None = None):
        super().__init__(f"{service}: {message}")
        self.service, self.message, self.log_tail, self.log_file = service, message, log_tail, log_file


@dataclass
class StageOptions:
    explorers: int = 1
    ready_timeout_s: float = 600.0
    stop_timeout_s: float = 120.0
    auth_token: str | None = None
    environ: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    live: bool | None = None


def _explorer_ids(stage: Stage, n: int) -> list[str]:
    name = stage.config.explorer.name
    return [name] if n == 1 else [f"{name}-{i}" for i in range(n)]


class StageRun:
    """The processes of one stage and their supervision."""

    def __init__(self, stage: Stage, model_path: str, opts: StageOptions, multi_stage: bool, label: str):
        self.stage, self.opts, self.label = stage, opts, label
        self.config = stage.config
        self.job_dir = stage.job_dir
        self.config_file = write_config(effective_tree(stage, model_path, multi_stage), self.job_dir)
        self.model_path = model_path
        self.env = child_env(opts.environ, opts.auth_token)
        first, second = WAVES[self.config.mode]
        self.waves = [[self._process(s) for s in first], [p for s in second for p in self._processes(s)]]
        total = self.config.buffer.total_steps or self.config.trainer.total_steps
        self.progress = Progress(self.job_dir, label, total, live=opts.live)

    def _process(
        self, service: str, explorer_id: str | None = None, shard: str | None = None
    ) -> ServiceProcess:
        name = service if explorer_id in (None, self.config.explorer.name) else explorer_id
        run_dir = self.job_dir / "run"
        argv = service_argv(service, self.config_file, run_dir / f"{name}.port", self.config.trainer.nproc)
        if explorer_id is not None:
            argv += ["--explorer-id", explorer_id]
        if shard is not None:
            argv += ["--shard", shard]
        return ServiceProcess(
            name=name,
            argv=argv,
            log_file=self.job_dir / "log" / f"{name}.log",
            port_file=run_dir / f"{name}.port",
            env=dict(self.env),
            finishes_run=service in ("trainer", "explorer"),
        )

    def _processes(self, service: str) -> list[ServiceProcess]:
        if service != "explorer":
            return [self._process(service)]
        ids = _explorer_ids(self.stage, self.opts.explorers)
        if len(ids) == 1:
            return [self._process(service, ids[0])]
        return [self._process(service, eid, f"{i}/{len(ids)}") for i, eid in enumerate(ids)]

    @property
    def processes(self) -> list[ServiceProcess]:
        return [p for wave in self.waves for p in wave]

    def _fail(self, p: ServiceProcess, message: str) -> StageFailed:
        return StageFailed(p.name, message, p.tail(30), p.log_file)

    # ------------------------------------------------------------------ start
    async def _start_wave(self, wave: list[ServiceProcess], stop: asyncio.Event) -> None:
        for p in wave:
            p.start(self.opts.cwd)
            print(f"[{self.label}] started {p.name} (pid {p.pid}), log {p.log_file}", flush=True)
        pending = list(wave)
        deadline = time.monotonic() + self.opts.ready_timeout_s
        while pending:
            for p in list(pending):
                code = p.poll()
                if code is not None:
                    if code != 0 or not p.finishes_run:
                        raise self._fail(p, f"exited with code {code} before it was ready")
                    pending.remove(p)  # finished already (a tiny run)
                elif await asyncio.to_thread(p.healthy):
                    print(f"[{self.label}] {p.name} ready at {p.address}", flush=True)
                    pending.remove(p)
            if not pending or stop.is_set():
                return
            if time.monotonic() > deadline:
                p = pending[0]
                raise self._fail(p, f"not ready after {self.opts.ready_timeout_s:.0f}s")
            await _wait(stop, POLL_S)

    def _peer_env(self) -> None:
        """Tell the second wave where the first listens (RFT_<SERVICE>_ADDRESS)."""
        for p in self.waves[0]:
            var = f"RFT_{p.name.upper()}_ADDRESS"
            for q in self.waves[1]:
                q.env = {**q.env, var: p.address}

    # ------------------------------------------------------------------ supervise
    async def run(self, stop: asyncio.Event) -> str:
        """'finished' or 'interrupted'; raises StageFailed. Always stops every process."""
        feeder: asyncio.Task[int] | None = None
        feed_stop = asyncio.Event()
        self.progress.start()
        try:
            await self._start_wave(self.waves[0], stop)
            if stop.is_set():
                return "interrupted"
            self._peer_env()
            await self._start_wave(self.waves[1], stop)
            if self._needs_feeder():
                from services.launch.offline_data import feed  # torch/transformers: only when needed

                buffer = next(p for p in self.waves[0] if p.name == "buffer")
                feeder = asyncio.create_task(
                    feed(self.config.model_copy(update={"model": self.config.model.model_copy(
                        update={"model_path": self.model_path})}), buffer.address, feed_stop,
                        self.opts.auth_token)
                )  # fmt: skip
            return await self._supervise(stop, feeder)
        finally:
            feed_stop.set()
            if feeder is not None and not feeder.done():
                feeder.cancel()
            self.progress.stop()
            await self.shutdown()

    def _needs_feeder(self) -> bool:
        eb = self.config.buffer.trainer_input.experience_buffer
        return self.config.mode == "train" and bool(eb.path)

    async def _supervise(self, stop: asyncio.Event, feeder: asyncio.Task[int] | None) -> str:
        finishers = [p for p in self.waves[1] if p.finishes_run]
        trainer_done_at: float | None = None
        while True:
            self.progress.poll()
            self.progress.render()
            if stop.is_set():
                return "interrupted"
            if feeder is not None and feeder.done() and feeder.exception() is not None:
                exc = feeder.exception()
                raise StageFailed("offline data", f"{type(exc).__name__}: {exc}")
            for p in self.processes:
                code = p.poll()
                if code is None:
                    continue
                if code != 0:
                    raise self._fail(p, f"exited with code {code}")
                if not p.finishes_run:
                    raise self._fail(p, "exited while the run was still going")
            if all(p.poll() == 0 for p in finishers):
                return "finished"
            trainer = next((p for p in finishers if p.name == "trainer"), None)
            if trainer is not None and trainer.poll() == 0:
                trainer_done_at = trainer_done_at or time.monotonic()
                if time.monotonic() - trainer_done_at > EXPLORER_GRACE_S:
                    return "finished"  # the trainer is done; explorers that did not notice are stopped
            await _wait(stop, POLL_S)

    # ------------------------------------------------------------------ stop
    async def _stop_wave(self, wave: list[ServiceProcess]) -> None:
        running = [p for p in wave if p.running]
        for p in running:
            p.terminate()
        deadline = time.monotonic() + self.opts.stop_timeout_s
        for p in running:
            if await asyncio.to_thread(p.wait, max(0.0, deadline - time.monotonic())) is None:
                print(f"[{self.label}] {p.name} did not stop in {self.opts.stop_timeout_s:.0f}s; killing it",
                      flush=True)  # fmt: skip
                p.kill()
                await asyncio.to_thread(p.wait, 10.0)

    async def shutdown(self) -> None:
        await self._stop_wave(self.waves[1])
        await self._stop_wave(self.waves[0])

    def kill_all(self) -> None:
        for p in self.processes:
            p.kill()


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Wait up to `timeout_s`, returning early when `event` is set (the supervision tick)."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=timeout_s)


def stage_total_steps(stage: Stage) -> int | None:
    c = stage.config
    return c.buffer.total_steps or c.trainer.total_steps


def train_batch_size(stage: Stage) -> int:
    return resolve(stage.config).train_batch_size
