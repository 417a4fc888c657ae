"""A real Docker engine and compose CLI for the deploy tests (tests/deploy).

`ensure_engine()` uses the engine that answers `docker info`; where none does, on Linux as root, it
installs Debian's engine and compose (`apt-get install -y docker.io docker-compose`, when `dockerd` is
missing) and starts `/usr/sbin/dockerd` in the background (it logs to ~/.cache/rft-deploy/dockerd.log);
`Engine.close()` stops a daemon it started. Anything it cannot do skips the calling test with a reason
that starts with '!!!', never silently. `debootstrap`, which deploy/build_offline.py needs for its base
image, is installed the same way when missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("RFT_DEPLOY_CACHE") or Path.home() / ".cache" / "rft-deploy")
DOCKERD = "/usr/sbin/dockerd"
START_DEADLINE_S = 60.0


def _skip(reason: str) -> None:
    pytest.skip(f"!!! {reason}: the deploy test of the compose stack is SKIPPED")


def _ok(cmd: list[str], timeout: float = 30) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _engine_answers() -> bool:
    return shutil.which("docker") is not None and _ok(["docker", "info"])


def _apt_install(packages: list[str]) -> None:
    if shutil.which("apt-get") is None:
        _skip(f"no apt-get to install {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            _skip(f"`{' '.join(cmd)}` failed ({done.returncode}): {(done.stdout + done.stderr)[-800:]}")


def compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) or `docker-compose` (v1, Debian's 1.29), whichever is installed."""
    if shutil.which("docker") and _ok(["docker", "compose", "version"]):
        return ["docker", "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


@dataclass
class Engine:
    compose: list[str]
    daemon: subprocess.Popen | None = None  # a dockerd started here

    def close(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()


def ensure_engine() -> Engine:
    """A Docker engine that answers, and a compose CLI; or skip loudly."""
    daemon = None
    if not _engine_answers():
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            _skip("no Docker engine answers `docker info`, and installing one needs Linux and root")
        if not os.path.exists(DOCKERD):
            _apt_install(["docker.io", "docker-compose"])
        if not os.path.exists(DOCKERD):
            _skip(f"{DOCKERD} is still missing after installing docker.io")
        CACHE.mkdir(parents=True, exist_ok=True)
        with (CACHE / "dockerd.log").open("wb") as log:
            daemon = subprocess.Popen([DOCKERD], stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_DEADLINE_S
        while not _engine_answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                daemon.kill() if daemon.poll() is None else None
                tail = (CACHE / "dockerd.log").read_text(errors="replace")[-800:]
                _skip(f"dockerd did not come up within {START_DEADLINE_S:g}s (log tail: {tail})")
            time.sleep(0.5)  # ok-sleep: polling dockerd with a deadline
    if compose_cli() is None and os.geteuid() == 0:
        _apt_install(["docker-compose"])
    cli = compose_cli()
    if cli is None:
        Engine([], daemon).close()
        _skip("neither `docker compose` nor `docker-compose` is installed")
    if shutil.which("debootstrap") is None and os.geteuid() == 0:
        _apt_install(["debootstrap"])
    return Engine(cli, daemon)
