"""A compose project of deploy/ driven as a user would, for the deploy tests (tests/deploy): `compose`
runs `docker compose --env-file F -p P -f deploy/docker-compose.yml [-f override] ...`, and the rest reads
the stack's state from the engine (containers, their state, logs) and from its data volume (the job
folder's metrics and checkpoint lineage). `build_images` makes the images with deploy/build_offline.py,
without any registry."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.docker_engine import Engine

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IMAGE_TAG = "rft-mesh:deploy-test"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(what: str, check: Callable[[], Any], timeout: float, describe: Callable[[], str]) -> Any:
    """Poll `check` until it returns something truthy; fail with the stack's state after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{describe()}")
        time.sleep(0.5)  # ok-sleep: polling with a deadline


def build_images() -> dict[str, str]:
    """RFT_IMAGE and REDIS_IMAGE built by deploy/build_offline.py (cached between runs), and build_s."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(DEPLOY / "build_offline.py"), "--tag", IMAGE_TAG],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, f"deploy/build_offline.py failed:\n{done.stderr[-6000:]}"
    env = dict(line.split("=", 1) for line in done.stdout.split())
    env["build_s"] = f"{time.monotonic() - start:.0f}"
    print(done.stderr, file=sys.stderr)
    return env


@dataclass
class Stack:
    """One compose project of deploy/docker-compose.yml (plus the override files in `files`)."""

    engine: Engine
    project: str
    env_file: Path
    env: dict[str, str]
    seen: dict[str, Any] = field(default_factory=dict)
    files: tuple[str, ...] = ("docker-compose.yml",)  # under deploy/, in order
    job: str = "/data/checkpoints/rft-mesh/compose"  # the run config's job folder in the containers

    def compose(self, *args: str, timeout: float = 300) -> str:
        cmd = [*self.engine.compose, "--env-file", str(self.env_file), "-p", self.project]
        for name in self.files:
            cmd += ["-f", str(DEPLOY / name)]
        cmd += args
        # variables of this shell would override the env file: the stack sees only the file's
        environ = {k: v for k, v in os.environ.items() if k not in self.env}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ)
        if done.returncode != 0:
            pytest.fail(f"`{' '.join(cmd[-len(args) - 1 :])}` failed: {done.stdout}{done.stderr}")
        return done.stdout

    def containers(self, service: str | None = None) -> list[str]:
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        out = subprocess.run(["docker", "ps", "-aq", "--no-trunc", *filters], capture_output=True, text=True)
        return out.stdout.split()

    def inspect(self, cid: str) -> dict[str, Any]:
        out = subprocess.run(["docker", "inspect", cid], capture_output=True, text=True)
        return json.loads(out.stdout)[0] if out.returncode == 0 else {}

    def one(self, service: str) -> str:
        (cid,) = self.containers(service)
        return cid

    def state(self, service: str) -> tuple[str, int, int]:
        """(status, exit code, restart count) of a single-container service."""
        info = self.inspect(self.one(service))
        return info["State"]["Status"], info["State"]["ExitCode"], info["RestartCount"]

    def health(self, service: str) -> str:
        """The healthcheck's verdict on a single-container service ("" before its first probe)."""
        return self.inspect(self.one(service)).get("State", {}).get("Health", {}).get("Status", "")

    def logs(self, cid: str, tail: int | None = None) -> str:
        cmd = ["docker", "logs", *(["--tail", str(tail)] if tail else []), cid]
        out = subprocess.run(cmd, capture_output=True, text=True)
        return out.stdout + out.stderr

    def job_dir(self) -> Path:
        out = subprocess.run(
            ["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", f"{self.project}_rft-data"],
            capture_output=True, text=True,
        )  # fmt: skip
        return Path(out.stdout.strip()) / self.job.removeprefix("/data/")

    def trainer_rows(self) -> list[dict[str, Any]]:
        path = self.job_dir() / "metrics" / "trainer.jsonl"
        rows = []
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line being written
                    rows.append(json.loads(line))
        return rows

    def max_step(self) -> int:
        return max((int(r.get("step", 0)) for r in self.trainer_rows()), default=0)

    def lineage_explorers(self) -> set[str]:
        """Explorer ids whose experiences the latest durable checkpoint's lineage holds."""
        job = self.job_dir()
        marker = job / "latest_checkpointed_iteration.txt"
        step = marker.read_text().strip() if marker.is_file() else ""
        path = job / f"global_step_{step}" / "lineage.jsonl"
        if not step.isdigit() or not path.is_file():
            return set()
        ids = set()
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                ids |= {uid.split("/", 1)[0] for uid in json.loads(line)["uids"]}
        return ids

    def explorer_ids(self) -> dict[str, str]:
        """container id -> explorer id (`explorer-<hostname>`, as the compose command sets it)."""
        return {
            cid: f"explorer-{self.inspect(cid)['Config']['Hostname']}" for cid in self.containers("explorer")
        }

    def sigkill(self, service: str) -> None:
        """SIGKILL the container's main process from the host (a crash: its restart policy applies)."""
        pid = self.inspect(self.one(service))["State"]["Pid"]
        assert pid > 0, f"{service} is not running"
        os.kill(pid, signal.SIGKILL)

    def describe(self) -> str:
        parts = [f"seen so far: {json.dumps(self.seen)}", f"trainer step: {self.max_step()}"]
        for cid in self.containers():
            info = self.inspect(cid)
            state = info.get("State", {})
            parts.append(
                f"--- {info.get('Name')} {state.get('Status')} exit={state.get('ExitCode')} "
                f"restarts={info.get('RestartCount')}\n{self.logs(cid, tail=25)[-4000:]}"
            )
        return "\n".join(parts)

    def dump_logs(self, folder: Path) -> None:
        """Write every container's whole log to `folder`/<name>.log."""
        folder.mkdir(parents=True, exist_ok=True)
        for cid in self.containers():
            name = self.inspect(cid).get("Name", cid).strip("/")
            (folder / f"{name}.log").write_text(self.logs(cid))

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        found = {}
        for kind, cmd in {
            "containers": ["docker", "ps", "-aq", "--filter", label],
            "networks": ["docker", "network", "ls", "-q", "--filter", label],
            "volumes": ["docker", "volume", "ls", "-q", "--filter", label],
            "volumes by name": ["docker", "volume", "ls", "-q", "--filter", f"name={self.project}_"],
        }.items():
            found[kind] = subprocess.run(cmd, capture_output=True, text=True).stdout.split()
        return {k: v for k, v in found.items() if v}
