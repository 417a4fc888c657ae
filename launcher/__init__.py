"""`rft run`: a whole run as local processes on loopback, one stage after another.

Not a service: it starts the services (`python -m services.<name> --config FILE`) and talks to them
only through their process interface (port file, gRPC health and liveness, SIGTERM) and the files they write
(metrics, checkpoints). It imports `services.common` and libraries, and the services' registries
only to check a config's names (names.py).

    names.py         every registry name and `module:object` plug-in of the config resolves (before any start)
    stages.py        stages, which processes each mode needs, the config every process reads
    gpus.py          which GPUs each process sees (CUDA_VISIBLE_DEVICES from cluster.gpu_per_node)
    preflight.py     Redis answers, monitor package installed, model folder there, the memory plan
                     fits the GPUs (before any start)
    processes.py     one child process: log file, port file, health, liveness, SIGTERM then SIGKILL
    runner.py        one stage: its processes, the progress display, the offline-data feeder
    supervisor.py    start in waves, supervise, restart what fails (`services.max_restarts`) or hangs,
                     stop in order
    watchdog.py      hung or busy: no liveness answer for `services.liveness_timeout` seconds
    autoheal.py      the compose stack's restarter of unhealthy containers (`python -m launcher.autoheal`)
    offline_data.py  SFT rows -> experiences into a train stage's buffer
    progress.py      live progress from metrics/*.jsonl (rich on a TTY, log lines otherwise)
    summary.py       summary.json per stage and for the run
    plot.py          curves.png from metrics/*.jsonl (`rft plot`, and at the end of every run)
    top/             `rft top`: a live view of a running job from its services' endpoints (gRPC)

Exit codes (`run` returns them): 0 finished, 1 a runtime failure (the failing service is named with
the first exception of its log and its last log lines), 2 a bad config (names included), 130 stopped by SIGINT/SIGTERM (checkpoints flushed; run it again
to continue from them).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from launcher.gpus import host_cuda, stage_gpus
from launcher.names import check_config
from launcher.preflight import PreflightError, memory_problems, preflight
from launcher.runner import StageFailed, StageOptions, StageRun, stage_total_steps, train_batch_size
from launcher.stages import Stage, run_stages
from launcher.summary import (
    earlier_wall_time,
    last_hf_export,
    read_summary,
    run_summary,
    stage_summary,
    write_summary,
)
from services.common.config import ConfigError, RFTConfig, load_config, resolve
from services.common.config.gpus import GpuPlacementError
from services.common.config.loader import config_warnings
from services.common.plugins import python_path

__all__ = ["run"]

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130


def _err(message: str) -> None:
    print(f"rft run: {message}", file=sys.stderr, flush=True)


def _finished_before(previous: dict | None, total_steps: int | None) -> bool:
    """Whether an earlier run finished this stage (single-stage runs included) and nothing more is
    asked now: a finished run started again with a larger `total_steps` than it ran with trains on.
    (A run may finish before its `total_steps` when the data ends, so the steps done are compared
    only when the summary does not record the `total_steps` it ran with.)"""
    if not previous or previous.get("status") != "finished":
        return False
    if total_steps is None:
        return True
    asked = previous.get("total_steps")
    if asked is None:
        asked = max(int(previous.get("steps") or 0), int(previous.get("explore_steps") or 0))
    return total_steps <= int(asked)


async def _run_stages(
    config: RFTConfig, stages: list[Stage], opts: StageOptions, stop: asyncio.Event, active: list[StageRun]
) -> tuple[str, list[tuple[str, dict]], StageFailed | None]:
    results: list[tuple[str, dict]] = []
    model_path = stages[0].config.model.model_path
    multi = len(stages) > 1 or bool(stages[0].name)
    for i, stage in enumerate(stages):
        label = stage.name or config.name
        summary_file = stage.job_dir / "summary.json"
        previous = read_summary(summary_file)
        if config.continue_from_checkpoint and _finished_before(previous, stage_total_steps(stage)):
            print(f"[{label}] finished in an earlier run; continuing from it", flush=True)
            results.append((stage.name, previous))
        else:
            # the time of the runs this one continues: the metrics files keep their lines
            t0 = time.monotonic() - (earlier_wall_time(previous) if config.continue_from_checkpoint else 0.0)
            status, failure = "failed", None
            run = StageRun(stage, model_path, opts, multi, label)
            active[:] = [run]
            try:
                status = await run.run(stop)
            except StageFailed as exc:
                failure = exc
            finally:
                active.clear()
            summary = stage_summary(stage.job_dir, status, time.monotonic() - t0, train_batch_size(stage))
            summary["total_steps"] = stage_total_steps(stage)  # what was asked, for a later start
            if multi:
                write_summary(summary_file, summary)
            results.append((stage.name, summary))
            if status != "finished":
                return status, results, failure
        if i + 1 < len(stages):
            export = last_hf_export(stage.job_dir)
            if export is None:
                return "failed", results, StageFailed(
                    label, f"left no HF export in {stage.job_dir} for the next stage "
                    "(set trainer.save_hf_checkpoint: last)")  # fmt: skip
            model_path = str(export)
    return "finished", results, None


async def _main(config: RFTConfig, stages: list[Stage], opts: StageOptions) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals_seen = [0]
    active: list[StageRun] = []

    def on_signal(signum: int) -> None:
        signals_seen[0] += 1
        if signals_seen[0] == 1:
            print(f"\nrft run: {signal.Signals(signum).name}: stopping the services "
                  "(checkpoints are flushed; again to kill them)", file=sys.stderr, flush=True)  # fmt: skip
            stop.set()
        else:
            for run in active:
                run.kill_all()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        status, results, failure = await _run_stages(config, stages, opts, stop, active)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    summary = run_summary(results, status)
    top = resolve(config).job_dir / "summary.json"
    write_summary(top, summary)
    plot = _plot(top.parent)
    if failure is not None:
        where = f" ({failure.log_file})" if failure.log_file else ""
        _err(f"the {failure.service} failed: {failure.message}")
        if failure.log_tail:
            print(f"--- last lines of the {failure.service} log{where} ---\n{failure.log_tail}\n---",
                  file=sys.stderr, flush=True)  # fmt: skip
        print(f"summary: {top}{plot}", flush=True)
        return EXIT_FAILED
    if status == "interrupted":
        print(f"rft run: stopped; run the same command again to continue. summary: {top}{plot}", flush=True)
        return EXIT_INTERRUPTED
    _print_done(summary, top, plot)
    return EXIT_OK


def _plot(job_dir: Path) -> str:
    """Draw the run's curves (plot.py) into job_dir/curves.png; returns the `plot: <path>` line to print
    after the summary's (with its newline), or '' when drawing failed: that never fails a run, it is
    reported on stderr."""
    try:
        from launcher.plot import plot_job

        return f"\nplot: {plot_job(job_dir)}"
    except Exception as exc:  # a plot is a by-product: a run that trained stays a success
        _err(f"could not draw the curves ({type(exc).__name__}: {exc}); `rft plot {job_dir}` tries again")
        return ""


def _print_done(summary: dict, top: Path, plot: str) -> None:
    def f(v):
        return "-" if v is None else f"{v:.3f}"

    evals = "".join(
        f", eval {name} {f(e.get('first'))} (step {e.get('first_step')}) -> {f(e.get('last'))} (step {e.get('last_step')})"
        for name, e in (summary.get("eval") or {}).items()
    )
    print(
        f"rft run: finished: {summary['steps']} steps, reward {f(summary['first_reward_mean'])} -> "
        f"{f(summary['last_reward_mean'])}{evals}, {summary['wall_time_s']:.0f}s\n"
        f"checkpoint: {summary['checkpoint']}\nsummary: {top}{plot}",
        flush=True,
    )


def run(
    config_file: str | Path,
    overrides: Sequence[str] = (),
    *,
    explorers: int = 1,
    live: bool | None = None,
    plugin_dirs: Sequence[str] = (),
) -> int:
    """Run the config end to end; returns the exit code. `plugin_dirs`: `--plugin-dir` folders, added
    to the config's `plugin_dirs`."""
    try:
        config = load_config(config_file, overrides=list(overrides))
        # every name resolves (plug-ins imported) before anything starts; plugin_dirs become absolute
        config, problems = check_config(config, config_file, plugin_dirs)
        if problems:
            raise ConfigError(str(config_file), problems)
        stages = run_stages(config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    for line in config_warnings(config):  # keys that load but have no effect here (config/compat.py)
        _err(f"warning: {line}")
    if explorers < 1:
        _err("--explorers must be >= 1")
        return EXIT_CONFIG
    if explorers > 1 and any(stage.config.mode == "serve" for stage in stages):
        _err("--explorers: mode serve runs one explorer (one endpoint); drop --explorers")
        return EXIT_CONFIG
    cuda = host_cuda(os.environ)
    try:  # every stage's GPUs fit before the first one starts
        for stage in stages:
            stage_gpus(stage.config, explorers, os.environ, cuda_devices=cuda.devices)
    except GpuPlacementError as exc:
        _err(f"{f'stage {stage.name!r}: ' if stage.name else ''}{exc}")
        return EXIT_CONFIG
    too_big = memory_problems([s.config for s in stages], cuda.memory_gib, explorers)
    if too_big:  # the memory plan (`rft config show` prints it)
        _err("the GPUs cannot hold this run:\n" + "\n".join(f"  {p}" for p in too_big))
        return EXIT_CONFIG
    try:
        preflight([s.config for s in stages])
    except PreflightError as exc:
        _err(str(exc))
        return EXIT_FAILED
    environ = dict(os.environ)
    if config.plugin_dirs:  # the services import them from the config; their own children find them too
        environ["PYTHONPATH"] = python_path(config.plugin_dirs, environ)
    opts = StageOptions(
        explorers=explorers,
        auth_token=config.services.auth_token,
        environ=environ,
        cwd=Path.cwd(),
        live=live,
    )
    return asyncio.run(_main(config, stages, opts))
