"""Run `rft run` as a subprocess for the end-to-end tests: the command line, an environment that finds
the repository and its generated protos, config files derived from the shipped examples, and polling
helpers (deadline-bound, no sleeps to synchronise)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "models" / "tiny"


def env() -> dict[str, str]:
    """This environment with the repository and its protos first on PYTHONPATH; an existing PYTHONPATH
    (e.g. the GPU check's folder of carried wheels) stays after them."""
    paths = [
        str(ROOT),
        str(ROOT / "protos"),
        *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def rft_argv(config: Path, *sets: str) -> list[str]:
    argv = [sys.executable, "-m", "launcher.cli", "run", "--config", str(config)]
    for s in sets:
        argv += ["--set", s]
    return argv


def run_rft(
    config: Path, *sets: str, timeout_s: float = 280, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        rft_argv(config, *sets),
        cwd=ROOT,
        env={**env(), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def start_rft(config: Path, *sets: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen(
            rft_argv(config, *sets), cwd=ROOT, env=env(), stdout=fh, stderr=subprocess.STDOUT
        )


def tiny_model() -> Path:
    """The repository's tiny model (made once, as scripts/quickstart.sh does)."""
    if (TINY_MODEL / "config.json").exists():
        return TINY_MODEL
    from launcher.tiny_model import make_tiny_model
    from tests.support.file_lock import file_lock

    with file_lock(TINY_MODEL.parent / ".tiny.lock"):  # test workers may ask at once
        if not (TINY_MODEL / "config.json").exists():
            make_tiny_model(TINY_MODEL)
    return TINY_MODEL


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def write_config(path: Path, tree: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def poll_until(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Call `check` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)  # ok-sleep: polling with a deadline


def jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def child_pids(output: str) -> list[int]:
    """The pids `rft run` reported for the processes it started."""
    return [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie waiting for its parent counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


SUMMARY_KEYS = ("status", "steps", "model_version", "first_reward_mean", "last_reward_mean",
                "wall_time_s", "samples_per_s", "checkpoint")  # fmt: skip


def assert_no_orphans(output: str) -> None:
    """Every process `rft run` started has exited (no orphans left behind)."""
    pids = child_pids(output)
    assert pids, "rft run reported no processes"
    poll_until(lambda: not any(alive(p) for p in pids), 15, f"children {pids} to exit")
