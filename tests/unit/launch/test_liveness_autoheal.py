"""The compose stack's `autoheal` (launcher/autoheal.py) against a stand-in Docker Engine API on a real
unix socket: it finds its own compose project from its container's labels, asks only for the unhealthy
containers of that project labelled `rft.autoheal=true`, restarts each with the grace it was given, and
goes on when one restart fails."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import UnixStreamServer

import pytest

from launcher.autoheal import DockerAPI, heal_once, main


class _UnixHTTPServer(ThreadingHTTPServer, UnixStreamServer):
    address_family = UnixStreamServer.address_family

    def get_request(self):  # a unix socket has no peer address; http.server wants one
        request, _ = self.socket.accept()
        return request, ("local", 0)


RUNNING_UNHEALTHY = {"Status": "running", "Restarting": False,
                     "Health": {"Status": "unhealthy", "FailingStreak": 12}}  # fmt: skip


class FakeEngine:
    """Answers the three calls autoheal makes and records what it was asked."""

    def __init__(self, path: Path, unhealthy: list[dict], failing: set[str] = frozenset(),
                 states: dict[str, dict] | None = None):  # fmt: skip
        self.calls: list[tuple[str, str]] = []
        engine = self
        # what inspecting each listed container says; by default running with a failing streak
        states = {c["Id"]: RUNNING_UNHEALTHY for c in unhealthy} | (states or {})

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                engine.calls.append(("GET", self.path))
                cid = self.path.split("/")[2] if self.path.count("/") == 3 else ""
                if self.path.startswith("/containers/self-id/json"):
                    self._reply(200, {"Config": {"Labels": {"com.docker.compose.project": "stack-a"}}})
                elif self.path.startswith("/containers/json"):
                    self._reply(200, unhealthy)
                elif cid in states:
                    self._reply(200, {"State": states[cid]})
                else:
                    self._reply(404, {"message": "no such container"})

            def do_POST(self):  # noqa: N802
                engine.calls.append(("POST", self.path))
                cid = self.path.split("/")[2]
                self.send_response(500 if cid in failing else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = _UnixHTTPServer(str(path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sock(tmp_path) -> Path:
    return tmp_path / "docker.sock"


def _filters(url: str) -> dict:
    return json.loads(urllib.parse.parse_qs(urllib.parse.urlparse(url).query)["filters"][0])


def test_it_restarts_the_unhealthy_containers_of_its_project(sock, capsys):
    engine = FakeEngine(sock, [{"Id": "c1", "Names": ["/stack-a-trainer-1"]},
                               {"Id": "c2", "Names": ["/stack-a-explorer-2"]}])  # fmt: skip
    try:
        api = DockerAPI(str(sock), timeout_s=5)
        assert api.project_of("self-id") == "stack-a"
        assert heal_once(api, "stack-a", grace_s=7) == ["stack-a-trainer-1", "stack-a-explorer-2"]
    finally:
        engine.close()
    listed = [url for verb, url in engine.calls if verb == "GET" and url.startswith("/containers/json")]
    assert _filters(listed[0]) == {
        "label": ["rft.autoheal=true", "com.docker.compose.project=stack-a"], "health": ["unhealthy"]
    }  # fmt: skip
    assert [c for c in engine.calls if c[0] == "POST"] == [
        ("POST", "/containers/c1/restart?t=7"), ("POST", "/containers/c2/restart?t=7")
    ]  # fmt: skip
    assert "autoheal: stack-a-trainer-1 is unhealthy" in capsys.readouterr().out


def test_a_failed_restart_does_not_stop_the_others(sock, capsys):
    engine = FakeEngine(sock, [{"Id": "gone", "Names": ["/a-buffer-1"]}, {"Id": "c2", "Names": ["/a-sync-1"]}],
                        failing={"gone"})  # fmt: skip
    try:
        assert heal_once(DockerAPI(str(sock), timeout_s=5), "a", grace_s=10) == ["a-sync-1"]
    finally:
        engine.close()
    assert (
        "restarting a-buffer-1 failed: POST /containers/gone/restart?t=10: HTTP 500"
        in capsys.readouterr().out
    )


def test_a_container_its_policy_is_restarting_is_left_alone(sock, capsys):
    """Docker marks a container that stopped `unhealthy` until its restart policy starts it again (then
    `starting`): a crash is the policy's; only a running container with failed checks is restarted."""
    listed = [{"Id": "crashed", "Names": ["/a-trainer-1"]}, {"Id": "exited", "Names": ["/a-explorer-1"]},
              {"Id": "fresh", "Names": ["/a-buffer-1"]}]  # fmt: skip
    states = {
        "crashed": {"Status": "restarting", "Restarting": True, "Health": {"Status": "unhealthy"}},
        "exited": {"Status": "exited", "Health": {"Status": "unhealthy", "FailingStreak": 0}},
        "fresh": {"Status": "running", "Health": {"Status": "unhealthy", "FailingStreak": 0}},
    }
    engine = FakeEngine(sock, listed, states=states)
    try:
        assert heal_once(DockerAPI(str(sock), timeout_s=5), "a", grace_s=10) == []
    finally:
        engine.close()
    assert not [c for c in engine.calls if c[0] == "POST"] and "restarting" not in capsys.readouterr().out


def test_main_looks_once_for_its_own_project(sock, capsys):
    engine = FakeEngine(sock, [])
    try:
        assert main(["--socket", str(sock), "--once", "--container", "self-id"]) == 0
    finally:
        engine.close()
    assert "compose project stack-a" in capsys.readouterr().out


def test_main_refuses_without_a_compose_project(sock, capsys):
    engine = FakeEngine(sock, [])
    try:
        assert main(["--socket", str(sock), "--once", "--container", "not-compose"]) == 1
    finally:
        engine.close()
    assert "cannot tell this stack's compose project" in capsys.readouterr().err
