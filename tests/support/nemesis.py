"""A nemesis for real `rft run`s: kills, pauses, hangs and a partitioned or slow store link, mixed at random.

Each fault waits for its trainer step, then acts on one service of the run (or on the buffer's link to Redis,
which goes through a `NetProxy`):

- `kill`: SIGKILL (`rft run` restarts the service in place);
- `pause`: SIGSTOP for a few seconds, then SIGCONT (shorter than the liveness window: nothing is restarted);
- `hang`: SIGSTOP, never resumed (`services.liveness_timeout` finds it silent, kills and restarts it);
- `partition`: the buffer <-> Redis link cut both ways for a while, then healed;
- `oneway`: the same link cut one way (the buffer's commands held, Redis's replies to earlier ones flow);
- `slow`: every chunk on that link delayed by 0.5 s for a while;
- `redis_disk` (DISK_KINDS, when Redis keeps its append-only file on a `SmallDisk`): the disk filled until
  Redis cannot write and exits (`appendfsync always`: it never acknowledges what it could not persist), held
  full a few seconds, then freed and Redis started again on its AOF, as a restart policy would;
- `job_disk` (DISK_KINDS, when `checkpoint_root_dir` is a `SmallDisk`): the disk of the job folder filled
  (checkpoints, lineage, metrics, the services' logs, `rft run`'s own run files), held full a few seconds,
  then freed: the services that fail on it are restarted and the run goes on from its last checkpoint.

Recovery is measured from the end of the fault (the kill or hang itself, the heal, Redis back, the disk
freed) to the next trainer step line.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.chaos import SERVICES, LineClock, chaos_tree, log_tails, service_pids, trainer_steps
from tests.support.netproxy import NetProxy
from tests.support.redis_server import RedisServer
from tests.support.rft_run import poll_until, start_rft, write_config
from tests.support.small_disk import SmallDisk

KINDS = ("kill", "pause", "hang", "partition", "oneway", "slow")
DISK_KINDS = ("redis_disk", "job_disk")
LIVENESS_S = 8


@dataclass
class Fault:
    kind: str
    service: str  # the process acted on ("buffer" for the link faults: its Redis link; "redis" or "job":
    # the disk of Redis or of the job folder)
    after_step: int
    hold_s: float  # how long a pause or a link fault lasts (0 for kill and hang)
    recovery_s: float | None = None  # end of the fault -> the next trainer step line


def nemesis_schedule(seed: int, faults: int, total_steps: int, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """`faults` faults, kinds (of `kinds`) and services drawn with `seed` (every kind once when faults >=
    len(kinds)), at increasing trainer steps in [2, 0.6 x total_steps]."""
    rng = random.Random(seed)
    kinds = [kinds[i % len(kinds)] for i in range(faults)]
    rng.shuffle(kinds)
    steps = sorted(rng.randint(2, max(2, int(total_steps * 0.6))) for _ in range(faults))
    out = []
    for kind, step in zip(kinds, steps, strict=True):
        service = "buffer" if kind in ("partition", "oneway", "slow") else rng.choice(SERVICES)
        service = {"redis_disk": "redis", "job_disk": "job"}.get(kind, service)
        hold = {"pause": rng.uniform(2, 5), "partition": rng.uniform(5, 12), "oneway": rng.uniform(5, 10),
                "slow": rng.uniform(5, 10), "redis_disk": rng.uniform(2, 6),
                "job_disk": rng.uniform(4, 8)}.get(kind, 0.0)  # fmt: skip
        out.append(Fault(kind, service, step, round(hold, 1)))
    return out


def nemesis_config(root: Path, redis_url: str, total_steps: int, prefix: str) -> tuple[Path, Path]:
    tree = chaos_tree(root, redis_url, total_steps=total_steps, save_interval=4, prefix=prefix)
    tree["services"]["liveness_timeout"] = LIVENESS_S
    return write_config(root / "nemesis.yaml", tree), root / "ckpt" / "chaos" / "run"


def run_nemesis(
    root: Path, redis: RedisServer, faults: list[Fault], total_steps: int, prefix: str, timeout_s: float
) -> tuple[int, float, Path, str]:
    """One run under `faults`; returns (rft run's exit code, wall seconds, job folder, log text). A
    `redis_disk` fault needs `redis.directory` on a `SmallDisk`, a `job_disk` fault `root / "ckpt"` (the
    run's `checkpoint_root_dir`)."""
    with NetProxy.start("127.0.0.1", redis.port) as link:
        config, job = nemesis_config(root, f"redis://127.0.0.1:{link.port}/0", total_steps, prefix)
        log = root / "rft.log"
        t0 = time.monotonic()
        clock = LineClock(job / "metrics" / "trainer.jsonl")
        proc = start_rft(config, log=log)
        marks: list[tuple[int, float]] = []
        try:
            for fault in faults:
                marks.append(_inject(proc, job, link, redis, fault, t0 + timeout_s))
            code = proc.wait(max(1.0, t0 + timeout_s - time.monotonic()))
        except (subprocess.TimeoutExpired, AssertionError) as exc:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(150)
            raise AssertionError(f"{exc}; faults {faults}\n{log_tails(log, job)}") from exc
        finally:
            clock.stop()
            link.heal()
            if proc.poll() is None:
                proc.kill()
        for fault, (lines, at) in zip(faults, marks, strict=True):
            seen = clock.first_after(lines)
            fault.recovery_s = None if seen is None else round(max(0.0, seen - at), 2)
        return code, time.monotonic() - t0, job, log.read_text(errors="replace")


def _inject(
    proc: subprocess.Popen, job: Path, link: NetProxy, redis: RedisServer, fault: Fault, deadline: float
) -> tuple[int, float]:
    """Wait for the fault's step, act; returns (trainer lines at the fault's end, the end's time)."""

    def reached() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"rft run exited with {proc.returncode} before the {fault.kind} fault")
        steps = trainer_steps(job)
        return bool(steps) and steps[-1] >= fault.after_step

    poll_until(reached, max(1.0, deadline - time.monotonic()), f"trainer step {fault.after_step}")
    if fault.kind in ("partition", "oneway", "slow"):
        {"partition": lambda: link.cut(), "oneway": lambda: link.cut("up"), "slow": lambda: link.delay(0.5)}[
            fault.kind
        ]()
        time.sleep(fault.hold_s)  # ok-sleep: the length of the injected fault
        link.heal()
        return len(trainer_steps(job)), time.time()
    if fault.kind == "redis_disk":
        return _redis_disk(redis, fault, job)
    if fault.kind == "job_disk":
        disk = SmallDisk(job.parents[1])  # <root>/ckpt, the checkpoint_root_dir
        disk.fill()
        time.sleep(fault.hold_s)  # ok-sleep: the length of the injected fault
        disk.free()
        return len(trainer_steps(job)), time.time()
    child_config = job / "config.yaml"
    pids = poll_until(lambda: service_pids(child_config, fault.service), 120, f"a running {fault.service}")
    sig = signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    if fault.kind == "pause":
        time.sleep(fault.hold_s)  # ok-sleep: the length of the injected fault
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    return len(trainer_steps(job)), time.time()


def _redis_disk(redis: RedisServer, fault: Fault, job: Path) -> tuple[int, float]:
    """Fill Redis's disk until it exits on a write it cannot persist; hold; free it and start Redis again."""
    disk = SmallDisk(redis.directory)
    process = redis.process
    assert process is not None, "redis is not running"
    disk.fill()
    poll_until(lambda: process.poll() is not None, 120, "redis-server to stop on its full disk")
    time.sleep(fault.hold_s)  # ok-sleep: the length of the injected fault
    disk.free()
    redis.launch()  # back on its append-only file, as a restart policy would start it
    return len(trainer_steps(job)), time.time()
