"""Runs one stage as local processes, start to end: builds its processes (the effective config, argv,
environment, log and port files of each), hands them to the `Supervisor` (start in waves, supervise,
restart, stop in order), and runs what belongs to the stage around them: the progress display,
for an SFT stage the feeder of offline data into the buffer, and in serve mode the line
`endpoint: http://host:port/v1` once the explorer's endpoint listens.

The stage is over when every process that ends the run (trainer; explorers; in bench mode the
explorer) has exited 0; the trainer ending first gives the explorers `EXPLORER_GRACE_S` (supervisor.py)
to see the run finished and stop. A process that fails is restarted up to `services.max_restarts`
times; with the in-process store (`services.buffer.store: memory`) a buffer failure restarts the
whole stage (stop everything in order, start again, feed the offline data again), since the
experiences died with the buffer. A process that
has stopped answering its liveness check for `services.liveness_timeout` seconds (stopped, wedged) is
killed and restarted the same way (supervisor.py, watchdog.py). Beyond that
the stage fails (`StageFailed` names the process and carries its last log lines). A stop request
(SIGINT/SIGTERM of `rft run`) stops the stage in order (see supervisor.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from launcher.gpus import stage_gpus
from launcher.processes import ServiceProcess
from launcher.progress import Progress
from launcher.stages import WAVES, Stage, child_env, effective_tree, service_argv, write_config
from launcher.supervisor import RestartPolicy, StageFailed, Supervisor
from services.common.config import resolve
from services.common.config.explorer import SERVE_URL_FILE

__all__ = ["StageFailed", "StageOptions", "StageRun", "stage_total_steps", "train_batch_size"]


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
        self.gpus = stage_gpus(self.config, opts.explorers, opts.environ)
        for warning in self.gpus.warnings:
            print(f"[{label}] warning: {warning}", flush=True)
        first, second = WAVES[self.config.mode]
        waves = [[self._process(s) for s in first], [p for s in second for p in self._processes(s)]]
        total = resolve(self.config).total_steps
        self.progress = Progress(self.job_dir, label, total, live=opts.live)
        in_process_buffer = self.config.services.buffer.store == "memory" and "buffer" in first
        self.supervisor = Supervisor(
            waves,
            label,
            RestartPolicy(
                self.config.services.max_restarts, frozenset({"buffer"} if in_process_buffer else ())
            ),
            cwd=opts.cwd,
            ready_timeout_s=opts.ready_timeout_s,
            stop_timeout_s=opts.stop_timeout_s,
            on_restart=lambda _name: self.progress.restarted(),
            liveness_timeout_s=self.config.services.liveness_timeout,
        )
        self._feeder: asyncio.Task[int] | None = None
        self._feed_stop = asyncio.Event()
        # serve mode: the explorer writes its endpoint URL here once it listens; printed once
        self._url_file: Path | None = None
        if self.config.mode == "serve":
            self._url_file = self.job_dir / "run" / SERVE_URL_FILE
            self._url_file.unlink(missing_ok=True)

    def _process(
        self, service: str, explorer_id: str | None = None, shard: str | None = None, index: int = 0
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
            env={**self.env, **self.gpus.env(service, index)},
            finishes_run=service in ("trainer", "explorer"),
            auth_token=self.opts.auth_token,
            tls=self.config.services.tls,
        )

    def _processes(self, service: str) -> list[ServiceProcess]:
        if service != "explorer":
            return [self._process(service)]
        ids = _explorer_ids(self.stage, self.opts.explorers)
        if len(ids) == 1:
            return [self._process(service, ids[0])]
        return [self._process(service, eid, f"{i}/{len(ids)}", i) for i, eid in enumerate(ids)]

    @property
    def waves(self) -> list[list[ServiceProcess]]:
        return self.supervisor.waves

    @property
    def processes(self) -> list[ServiceProcess]:
        return self.supervisor.processes

    async def run(self, stop: asyncio.Event) -> str:
        """'finished' or 'interrupted'; raises StageFailed. Always stops every process."""
        self.progress.start()
        try:
            return await self.supervisor.run(stop, tick=self._tick, started=self._start_feeder)
        finally:
            await self._stop_feeder()
            self.progress.stop()
            await self.supervisor.shutdown()

    def _tick(self) -> None:
        self.progress.poll()
        self.progress.render()
        if self._url_file is not None and self._url_file.is_file():
            url = self._url_file.read_text().strip()
            if url:
                print(f"[{self.label}] endpoint: {url}", flush=True)
                self._url_file = None
        feeder = self._feeder
        if feeder is not None and feeder.done() and not feeder.cancelled() and feeder.exception() is not None:
            exc = feeder.exception()
            raise StageFailed("offline data", f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ offline data (SFT stage)
    def _start_feeder(self) -> None:
        """Feed the buffer each time the stage (re)started: a restarted in-process buffer is empty."""
        eb = self.config.buffer.trainer_input.experience_buffer
        if self.config.mode != "train" or not eb.path:
            return
        from launcher.offline_data import feed  # torch/transformers: only when needed

        if self._feeder is not None:  # it fed the buffer that died
            self._feed_stop.set()
            self._feeder.cancel()
        buffer = next(p for p in self.waves[0] if p.name == "buffer")
        config = self.config.model_copy(
            update={"model": self.config.model.model_copy(update={"model_path": self.model_path})}
        )
        self._feed_stop = asyncio.Event()
        self._feeder = asyncio.create_task(
            feed(config, buffer.address, self._feed_stop, self.opts.auth_token)
        )

    async def _stop_feeder(self) -> None:
        feeder, self._feeder = self._feeder, None
        self._feed_stop.set()
        if feeder is not None and not feeder.done():
            feeder.cancel()
            await asyncio.wait([feeder], timeout=10.0)

    async def shutdown(self) -> None:
        await self.supervisor.shutdown()

    def kill_all(self) -> None:
        self.supervisor.kill_all()


def stage_total_steps(stage: Stage) -> int | None:
    return resolve(stage.config).total_steps


def train_batch_size(stage: Stage) -> int:
    return resolve(stage.config).train_batch_size
