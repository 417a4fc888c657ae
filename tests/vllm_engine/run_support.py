"""Whole `rft run`s with the vLLM engine for tests/vllm_engine/test_vllm_runs.py: the config of a short
GRPO run on the tiny model (the Redis store, so `launcher.audit` can count what was lost), the
processes of a running service (its vLLM engine core and workers are its children) and the audit of a
finished run against its lineage and its explorer's batches.

`rft run` starts every service with the interpreter it runs under, so a run started from the vLLM
environment (`.venv-vllm`) has an explorer that can build the `vllm` engine.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.audit import Audit, audit_job
from services.common.lineage import latest_checkpoint, read_lineage
from tests.support.rft_run import jsonl, poll_until, tiny_model

EXPLORER = "explorer"  # the explorer id of a single-explorer run (explorer.name)


def vllm_run_tree(
    root: Path,
    redis_url: str,
    *,
    name: str,
    steps: int,
    sync_style: str = "fixed",
    sync_offset: int = 0,
    inflight: bool = False,
    response_tokens: int = 4,
    ignore_eos: bool = False,
    batch_size: int = 2,
    repeat_times: int = 4,
) -> dict[str, Any]:
    """A short GRPO run on the tiny model with the `vllm` rollout engine, memory weight sync, the Redis
    store under its own stream prefix (`name`) and a checkpoint at the last step (its lineage)."""
    rollout: dict[str, Any] = {"engine_type": "vllm", "dtype": "float32"}
    if ignore_eos:
        rollout["ignore_eos"] = True
    return {
        "project": "vllm_runs",
        "name": name,
        "mode": "both",
        "checkpoint_root_dir": str(root / "ckpt"),
        "continue_from_checkpoint": True,
        "algorithm": {"algorithm_type": "grpo", "repeat_times": repeat_times, "kl_loss_fn": "none",
                      "optimizer": {"lr": 1e-3}},
        "model": {"model_path": str(tiny_model()), "max_prompt_tokens": 8, "max_response_tokens": response_tokens,
                  "temperature": 1.0},
        "buffer": {"batch_size": batch_size, "total_epochs": 1000, "total_steps": steps, "explorer_input": {
            "taskset": {"name": "arithmetic", "path": "examples/data/arithmetic.jsonl",
                        "default_workflow_type": "arithmetic",
                        "format": {"prompt_type": "plaintext", "prompt_key": "question",
                                   "response_key": "answer"}}}},
        "explorer": {"eval_on_startup": False, "inflight_weight_update": inflight, "rollout_model": rollout},
        "synchronizer": {"sync_method": "memory", "sync_style": sync_style, "sync_interval": 1,
                         "sync_offset": sync_offset},
        "trainer": {"save_interval": steps, "save_hf_checkpoint": "never", "max_checkpoints_to_keep": 1},
        "monitor": {"monitor_type": "none"},
        "services": {"buffer": {"store": "redis", "redis_url": redis_url, "stream_prefix": name},
                     "max_restarts": 2},
    }  # fmt: skip


def job_dir(root: Path, name: str) -> Path:
    return root / "ckpt" / "vllm_runs" / name


# ---------------------------------------------------------------------- processes
def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state is [0], ppid [1], pgid [2])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] != "Z":
                parents.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def living(pids: Iterable[int]) -> list[int]:
    """Those of `pids` that still run (a zombie counts as gone)."""
    return [p for p in pids if (fields := _stat(p)) is not None and fields[0] != "Z"]


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with the pid, names one process even if pids wrap."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


class ProcessTree:
    """Every process seen below `root` while the run goes (sampled by a thread every 0.2 s): what
    must all be gone once it ends, a SIGKILLed service's children included."""

    def __init__(self, root: int):
        self.root, self.seen = root, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            for pid in descendants(self.root):
                self.seen.setdefault(pid, start_time(pid))
            if self._stop.wait(0.2):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def leftovers(self) -> list[str]:
        """The processes seen that still run (same pid and start time), as 'pid command'."""
        return [f"{p} {command(p)[:80]}" for p, t in self.seen.items() if living([p]) and start_time(p) == t]


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def service_pid(config: Path, service: str) -> int | None:
    """The pid of the running `python -m services.<service> --config <config>`, if there is one."""
    want = [f"services.{service}", str(config)]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            args = command(int(entry.name)).split()
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] not in ("Z", "T") and all(w in args for w in want):
                return int(entry.name)
    return None


@dataclass
class Killed:
    """An explorer SIGKILLed mid-step: its pid and the processes it had started."""

    pid: int
    children: dict[int, str]  # pid -> command line, as they were at the kill


def kill_explorer_mid_step(config: Path, job: Path, after_step: int, timeout_s: float) -> Killed:
    """Once the explorer has finished explore step `after_step` (its metrics line), SIGKILL it while
    it samples the next step; returns what was killed (the vLLM engine core and its workers are
    among its children)."""
    explorer = job / "metrics" / "explorer.jsonl"

    def reached() -> bool:
        return any(r.get("step", 0) >= after_step for r in jsonl(explorer) if "rollout/reward/mean" in r)

    poll_until(reached, timeout_s, f"explore step {after_step}", interval_s=0.05)
    pid = poll_until(lambda: service_pid(job / "config.yaml", "explorer"), 10, "the explorer's pid")
    children = {p: command(p) for p in descendants(pid)}
    os.kill(pid, signal.SIGKILL)
    return Killed(pid, children)


# ---------------------------------------------------------------------- the audit
@dataclass
class RunRecord:
    """What a finished run leaves: the audit, each trainer step's trained uids and metrics, the
    explorer's step metrics."""

    audit: Audit
    lineage: dict[int, list[str]]
    train: list[dict[str, Any]]
    explore: list[dict[str, Any]]

    def batches(self, step: int) -> Counter[str]:
        """Trainer step `step`: how many of its experiences came from each explorer batch id (the explore
        step, `s` or `s.<incarnation>` after a restart)."""
        return Counter(uid.split("/")[2] for uid in self.lineage[step])


def read_run(job: Path) -> RunRecord:
    folder = latest_checkpoint(job)
    lineage = {s.step: list(s.uids) for s in read_lineage(folder)} if folder is not None else {}
    explore = [r for r in jsonl(job / "metrics" / "explorer.jsonl") if "rollout/reward/mean" in r]
    return RunRecord(audit_job(job), lineage, jsonl(job / "metrics" / "trainer.jsonl"), explore)


def wait_gone(pids: Iterable[int], timeout_s: float, what: str) -> None:
    pids = list(pids)
    poll_until(lambda: not living(pids), timeout_s, f"{what} {pids} to exit")
