"""The compose Tinker override (deploy/docker-compose.tinker.yml over deploy/docker-compose.yml and
deploy/docker-compose.serve.yml) checked against the code, without Docker: it adds a `tinker` service
on the same image whose command `python -m tinker_api` parses and points at the stack's synchronizer
and the serving explorer's endpoint as their configs place them, on the model the explorer serves; it
keeps the stack's trainer down (the Tinker server is the run's trainer); its port is the published and
probed one; the probe passes only while the server answers; every variable is in deploy/.env.example."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import load_config
from tests.support.compose_file import env_example, interpolate, merge_service
from tinker_api.__main__ import parser

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
FILES = ("docker-compose.yml", "docker-compose.serve.yml", "docker-compose.tinker.yml")


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / FILES[2]).read_text())


@pytest.fixture(scope="module")
def merged() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = {}
    for name in FILES:
        for svc, body in yaml.safe_load((DEPLOY / name).read_text())["services"].items():
            services[svc] = merge_service(services.get(svc, {}), body)
    return interpolate(services, env_example(), set())


def _config(service: dict[str, Any]):
    """The run config a service of the serve stack loads (its mount, its --set, its environment)."""
    argv = service["command"]
    argv = argv[2].split("exec ", 1)[1].split() if argv[:2] == ["sh", "-c"] else argv
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    return load_config(DEPLOY / "config" / "serve.yaml", overrides=sets, environ=service["environment"])


def test_the_override_adds_the_tinker_service_and_keeps_the_trainer_down(raw, merged):
    assert set(raw["services"]) == {"trainer", "tinker"}
    assert raw["services"]["trainer"] == {"profiles": ["trainer"]}  # only its profile starts it
    tinker = merged["tinker"]
    assert tinker["image"] == merged["explorer"]["image"] == env_example()["RFT_IMAGE"]
    assert tinker["depends_on"] == {
        "prepare": {"condition": "service_completed_successfully"},
        "synchronizer": {"condition": "service_healthy"},
        "explorer": {"condition": "service_healthy"},
    }
    assert tinker["restart"] == "on-failure" and tinker["labels"] == {"rft.autoheal": "true"}
    assert tinker["environment"]["RFT_AUTH_TOKEN"] == env_example()["RFT_AUTH_TOKEN"]
    assert "rft-data:/data" in tinker["volumes"]
    # the Dockerfile installs what the command runs
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "COPY tinker_api/ tinker_api/" in dockerfile and 'pip install ".[tinker]"' in dockerfile


def test_the_command_points_at_the_stacks_synchronizer_and_serving_explorer(merged):
    env = env_example()
    command = merged["tinker"]["command"]
    assert command[:3] == ["python", "-m", "tinker_api"]
    a = parser().parse_args(command[3:])
    sync, explorer = _config(merged["synchronizer"]), _config(merged["explorer"])
    assert a.synchronizer == sync.services.synchronizer.target == f"synchronizer:{env['SYNCHRONIZER_PORT']}"
    serve = explorer.explorer.serve
    assert a.explorer == f"http://explorer:{serve.port}/v1" and serve.host == "0.0.0.0"
    # the base model the explorer serves is the Tinker server's `--explorer-model`
    assert a.base_model == [f"tiny={explorer.model.model_path}"] and a.explorer_model == "tiny"
    assert explorer.mode == "serve" and sync.synchronizer.sync_method == "memory"  # no shared disk needed
    assert (sync.synchronizer.sync_style, sync.synchronizer.sync_interval) == ("fixed", 1)
    assert a.api_key == env["TINKER_API_KEY"] and a.api_key.startswith("tml-")
    assert (a.host, a.port) == ("0.0.0.0", int(env["TINKER_PORT"]))
    assert a.checkpoint_dir == Path("/data/tinker")


def test_the_port_is_published_and_probed(merged):
    env, tinker = env_example(), merged["tinker"]
    port = env["TINKER_PORT"]
    assert tinker["ports"] == [f"{env['PUBLISH_HOST']}:{port}:{port}"]
    test = tinker["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and f"http://127.0.0.1:{port}/api/v1/healthz" in test[3]
    assert {"interval", "timeout", "retries", "start_period"} <= set(tinker["healthcheck"])


def test_every_variable_is_documented_in_the_env_example():
    used: set[str] = set()
    interpolate(yaml.safe_load((DEPLOY / FILES[2]).read_text()), env_example(), used)
    assert used <= set(env_example()), used - set(env_example())
    assert {"TINKER_PORT", "TINKER_API_KEY", "SERVE_PORT", "SYNCHRONIZER_PORT"} <= used


class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/api/v1/healthz" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args):
        pass


def test_the_probe_passes_only_while_the_server_answers(raw):
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    port = str(web.server_address[1])
    script = interpolate(raw["services"]["tinker"]["healthcheck"]["test"], {"TINKER_PORT": port}, set())

    def probe() -> int:
        run = subprocess.run([sys.executable, *script[2:]], capture_output=True, text=True, timeout=60)
        return run.returncode

    try:
        assert probe() == 0
    finally:
        web.shutdown()
        web.server_close()
    assert probe() == 1


def test_docs_say_how_to_start_it():
    text = (ROOT / "docs" / "tinker.md").read_text()
    for needle in ("deploy/docker-compose.tinker.yml", "--synchronizer", "--explorer", "TINKER_PORT"):
        assert needle in text, needle
