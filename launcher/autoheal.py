"""Restarts the unhealthy containers of a compose stack: `python -m launcher.autoheal`, the stack's
`autoheal` service (deploy/docker-compose.yml).

Docker marks a container `unhealthy` when its healthcheck (`python -m services.common.healthcheck`, the
gRPC health check, answered by the service's event loop) has failed `retries` times in a row, but plain
`docker compose` never acts on it: restart policies look at exits only. This loop asks the Docker Engine
API (the socket mounted at /var/run/docker.sock) every `--interval` seconds for the running containers of
its own compose project labelled `rft.autoheal=true` whose health is `unhealthy` by their own failed checks
(a container that stopped is also marked `unhealthy` until its restart policy starts it again: those are
left to the policy), and restarts each one
(`POST /containers/ID/restart?t=GRACE`: SIGTERM, then SIGKILL after GRACE seconds, which is what a stopped
or wedged process needs; then the same container starts again, whatever its restart policy). A restarted
service resumes as after a crash (its checkpoint, the buffer's leases), so nothing is lost.

Its project is read from its own container's `com.docker.compose.project` label (its hostname is its
container id), so two stacks on one engine never restart each other's containers. Only the standard
library: the socket speaks plain HTTP/1.1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

SOCKET = "/var/run/docker.sock"
LABEL = "rft.autoheal=true"
PROJECT_LABEL = "com.docker.compose.project"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class DockerAPI:
    """The few Engine API calls this needs, over its unix socket."""

    def __init__(self, path: str = SOCKET, timeout_s: float = 30.0):
        self.path, self.timeout_s = path, timeout_s

    def _call(self, method: str, url: str, timeout_s: float | None = None) -> Any:
        conn = _UnixConnection(self.path, timeout_s or self.timeout_s)
        try:
            conn.request(method, url)
            reply = conn.getresponse()
            body = reply.read()
        finally:
            conn.close()
        if reply.status >= 300:
            raise RuntimeError(f"{method} {url}: HTTP {reply.status}: {body[:200].decode(errors='replace')}")
        return json.loads(body) if body else None

    def inspect(self, container: str) -> dict[str, Any]:
        return self._call("GET", f"/containers/{urllib.parse.quote(container)}/json")

    def project_of(self, container: str) -> str:
        labels = self.inspect(container)["Config"]["Labels"]
        project = (labels or {}).get(PROJECT_LABEL)
        if not project:
            raise RuntimeError(f"container {container} has no {PROJECT_LABEL} label: not run by compose")
        return project

    def unhealthy(self, project: str) -> list[dict[str, Any]]:
        filters = {"label": [LABEL, f"{PROJECT_LABEL}={project}"], "health": ["unhealthy"]}
        return self._call("GET", "/containers/json?filters=" + urllib.parse.quote(json.dumps(filters)))

    def restart(self, container_id: str, grace_s: int) -> None:
        # the call returns once the container runs again: up to `grace_s` for the stop, then the start
        self._call("POST", f"/containers/{container_id}/restart?t={grace_s}", timeout_s=grace_s + 60.0)


def _name(container: dict[str, Any]) -> str:
    names = container.get("Names") or [container.get("Id", "?")[:12]]
    return names[0].lstrip("/")


def failing(info: dict[str, Any]) -> bool:
    """Whether an inspected container is unhealthy by its own failed checks: running (not being
    restarted by its policy: Docker marks a container that stopped `unhealthy` until it starts again,
    then `starting`) with a streak of failures."""
    state = info.get("State") or {}
    health = state.get("Health") or {}
    return (
        state.get("Status") == "running"
        and not state.get("Restarting")
        and health.get("Status") == "unhealthy"
        and int(health.get("FailingStreak") or 0) > 0
    )


def heal_once(api: DockerAPI, project: str, grace_s: int) -> list[str]:
    """Restart every unhealthy container of `project` labelled for it; returns their names."""
    healed = []
    for container in api.unhealthy(project):
        name = _name(container)
        try:
            if not failing(api.inspect(container["Id"])):
                continue  # exited or restarting meanwhile: its restart policy's business
        except (OSError, RuntimeError):  # removed meanwhile
            continue
        print(f"autoheal: {name} is unhealthy (no healthy answer for its healthcheck's retries); "
              f"restarting it (SIGKILL after {grace_s} s)", flush=True)  # fmt: skip
        try:
            api.restart(container["Id"], grace_s)
        except (OSError, RuntimeError) as exc:  # it may have exited meanwhile: the next round sees
            print(f"autoheal: restarting {name} failed: {exc}", flush=True)
            continue
        healed.append(name)
    return healed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.autoheal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default=SOCKET, help=f"Docker Engine API socket (default {SOCKET})")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between looks (default 10)")
    parser.add_argument("--grace", type=int, default=10, help="seconds from SIGTERM to SIGKILL (default 10)")
    parser.add_argument("--project", default="", help="compose project (default: that of --container)")
    parser.add_argument(
        "--container", default=socket.gethostname(), help="this container's id (default: its hostname)"
    )
    parser.add_argument("--once", action="store_true", help="look once and exit")
    args = parser.parse_args(argv)
    api = DockerAPI(args.socket)
    try:
        project = args.project or api.project_of(args.container)
    except (OSError, RuntimeError, KeyError) as exc:
        print(f"autoheal: cannot tell this stack's compose project: {exc}", file=sys.stderr)
        return 1
    print(f"autoheal: watching the {LABEL} containers of compose project {project}", flush=True)
    while True:
        try:
            heal_once(api, project, args.grace)
        except (OSError, RuntimeError, ValueError) as exc:  # the engine restarting: try again later
            print(f"autoheal: {exc}", flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)  # ok-sleep: the watcher's period


if __name__ == "__main__":
    sys.exit(main())
