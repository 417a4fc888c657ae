"""Chaos campaigns: a real `rft run` on a real redis-server whose services are SIGKILLed at seeded
random moments (or SIGSTOPped and never resumed: a hang, `Kill.sig`), then audited through the lineage
(`launcher.audit`).

`rft run` restarts a killed service in place (`services.max_restarts`), so one run survives every
kill of a campaign; the audit then counts produced / trained once / trained twice / lost. A kill
moment is a trainer step reached plus a seeded random delay, so kills land mid-step, mid-save,
mid-sync or mid-put. Used by `tests/e2e/test_e2e_chaos.py` and `bench/chaos.py`.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.audit import Audit, audit_job
from tests.support.rft_run import jsonl, poll_until, start_rft, tiny_model, write_config

SERVICES = ("buffer", "trainer", "explorer", "synchronizer")


def chaos_tree(
    root: Path, redis_url: str, *, total_steps: int, save_interval: int, prefix: str
) -> dict[str, Any]:
    """A short strictly on-policy GRPO run on the Redis store (the guarantee's scope)."""
    return {
        "project": "chaos",
        "name": "run",
        "mode": "both",
        "checkpoint_root_dir": str(root / "ckpt"),
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "kl_loss_fn": "none",
                      "optimizer": {"lr": 1e-3}},
        "model": {"model_path": str(tiny_model()), "max_prompt_tokens": 8, "max_response_tokens": 4},
        "buffer": {"batch_size": 4, "total_epochs": 1000, "total_steps": total_steps, "explorer_input": {
            "taskset": {"path": "examples/data/arithmetic.jsonl", "default_workflow_type": "arithmetic",
                        "format": {"prompt_type": "plaintext", "prompt_key": "question",
                                   "response_key": "answer"}}}},
        "explorer": {"eval_on_startup": False},
        "synchronizer": {"sync_method": "memory", "sync_interval": 1, "sync_offset": 0},
        "trainer": {"save_interval": save_interval, "max_checkpoints_to_keep": 2},
        "monitor": {"monitor_type": "none"},
        "services": {"buffer": {"store": "redis", "redis_url": redis_url, "stream_prefix": prefix},
                     "max_restarts": 100},
    }  # fmt: skip


def service_pids(config: Path, service: str) -> list[int]:
    """Pids of the running (not stopped) `python -m services.<service> --config <config>` processes."""
    want = [f"services.{service}", str(config)]
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if state not in ("Z", "T") and all(w in args for w in want):
            pids.append(int(entry.name))
    return pids


def trainer_steps(job_dir: Path) -> list[int]:
    return [int(r["step"]) for r in jsonl(job_dir / "metrics" / "trainer.jsonl") if "step" in r]


@dataclass
class Kill:
    service: str
    after_step: int  # the trainer step reached before the kill
    delay_s: float  # the random part of the moment
    pid: int = 0
    resume_s: float | None = None  # kill -> the next trainer step line
    # SIGKILL, or SIGSTOP: a hang (never resumed; `rft run` must find it and kill it)
    sig: int = signal.SIGKILL


@dataclass
class Campaign:
    kills: list[Kill]
    returncode: int
    audit: Audit
    wall_s: float
    log: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def restarts_completed(self) -> int:
        return sum(1 for k in self.kills if k.resume_s is not None)


def schedule(seed: int, kills: int, total_steps: int, services: tuple[str, ...] = SERVICES) -> list[Kill]:
    """`kills` kills spread over `services` (each at least once when kills >= len(services)), at
    increasing seeded trainer steps in [2, total_steps / 2] (a tiny model trains a step in ~0.2 s: the
    second half leaves room for the last restart), each with a random delay < 1.5 s."""
    rng = random.Random(seed)
    order = [services[i % len(services)] for i in range(kills)]
    rng.shuffle(order)
    steps = sorted(rng.randint(2, max(2, total_steps // 2)) for _ in range(kills))
    return [Kill(s, k, round(rng.uniform(0.0, 1.5), 3)) for s, k in zip(order, steps, strict=True)]


class LineClock:
    """Records when each line of the trainer's metrics file appeared (a watcher thread, 0.1 s grain)."""

    def __init__(self, path: Path):
        self.path, self.times = path, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            n = len(jsonl(self.path))
            now = time.time()
            self.times += [now] * max(0, n - len(self.times))

    def first_after(self, index: int) -> float | None:
        return self.times[index] if index < len(self.times) else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_campaign(config: Path, job_dir: Path, kills: list[Kill], log: Path, timeout_s: float) -> Campaign:
    """Start `rft run`, kill per `kills`, wait for the end, audit."""
    t0 = time.monotonic()
    clock = LineClock(job_dir / "metrics" / "trainer.jsonl")
    proc = start_rft(config, log=log)
    marks: list[tuple[int, float]] = []
    try:
        for kill in kills:
            marks.append(_kill_when_due(proc, config, job_dir, kill, t0 + timeout_s))
        code = proc.wait(max(1.0, t0 + timeout_s - time.monotonic()))
    except (subprocess.TimeoutExpired, AssertionError) as exc:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(150)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise AssertionError(f"{exc}; kills {kills}\n{log_tails(log, job_dir)}") from exc
    finally:
        clock.stop()
        if proc.poll() is None:
            proc.kill()
    wall = time.monotonic() - t0
    for kill, (lines, at) in zip(kills, marks, strict=True):
        seen = clock.first_after(lines)
        kill.resume_s = None if seen is None else round(max(0.0, seen - at), 2)
    return Campaign(kills, code, audit_job(job_dir), wall, log.read_text(errors="replace"))


def log_tails(log: Path, job_dir: Path, lines: int = 25) -> str:
    """The last lines of `rft run`'s output and of every service's log (why a campaign stalled)."""
    parts = []
    for path in [log, *sorted((job_dir / "log").glob("*.log"))]:
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
    return "\n".join(parts)


def _kill_when_due(
    proc: subprocess.Popen, config: Path, job_dir: Path, kill: Kill, deadline: float
) -> tuple[int, float]:
    """Wait for the kill's moment, SIGKILL the service; returns (trainer lines so far, kill time)."""

    def reached():
        if proc.poll() is not None:
            raise AssertionError(f"rft run exited with {proc.returncode} before the kill of {kill.service}")
        steps = trainer_steps(job_dir)
        return bool(steps) and steps[-1] >= kill.after_step

    poll_until(reached, max(1.0, deadline - time.monotonic()), f"trainer step {kill.after_step}")
    time.sleep(kill.delay_s)  # ok-sleep: picks a random kill moment; nothing waits on it
    child_config = job_dir / "config.yaml"  # what `rft run` hands every service
    pids = poll_until(lambda: service_pids(child_config, kill.service), 120, f"a running {kill.service}")
    kill.pid = pids[0]
    lines = len(trainer_steps(job_dir))
    at = time.time()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, kill.sig)
    return lines, at


def write_chaos_config(root: Path, redis_url: str, **kw: Any) -> tuple[Path, Path]:
    tree = chaos_tree(root, redis_url, **kw)
    config = write_config(root / "chaos.yaml", tree)
    return config, root / "ckpt" / "chaos" / "run"
