"""The compose serve-mode override (deploy/docker-compose.serve.yml over deploy/docker-compose.yml, with
deploy/config/serve.yaml) checked against the code, without Docker: it changes only the run config of
every RFT service and the explorer's port, command and healthcheck (images, restart policies and
dependencies are the base file's); the mounted config loads in serve mode as each container sees it; the
endpoint listens on the port that is published and probed; the probe itself passes only for a serving
explorer whose endpoint answers; every variable is documented in deploy/.env.example.
`docker compose config` (or docker-compose v1) also merges the two files when either is installed."""

from __future__ import annotations

import http.server
import shlex
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.config import load_config, resolve
from tests.support.compose_file import env_example, interpolate, merge_service, merged_services

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
OVERRIDE = DEPLOY / "docker-compose.serve.yml"
RFT_SERVICES = ("synchronizer", "buffer", "trainer", "explorer")
CONFIG_TARGET = "/etc/rft/run.yaml"


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(OVERRIDE.read_text())


@pytest.fixture(scope="module")
def used() -> set[str]:
    names: set[str] = set()
    interpolate(yaml.safe_load(OVERRIDE.read_text()), env_example(), names)
    return names


@pytest.fixture(scope="module")
def merged(raw) -> dict[str, dict[str, Any]]:
    """The services of `-f docker-compose.yml -f docker-compose.serve.yml` with .env from .env.example."""
    base = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = {n: merge_service(s, raw["services"].get(n, {})) for n, s in base["services"].items()}
    return interpolate(services, env_example(), set())


def _argv(service: dict[str, Any]) -> list[str]:
    """The `python -m services.X ...` argv a service runs, also inside `sh -c`."""
    command = service["command"]
    if command[:2] == ["sh", "-c"]:
        return shlex.split(command[2].split("exec ", 1)[1])
    return command


def _loaded(service: dict[str, Any]):
    """The config the container loads: the mounted file, the command's --set, its environment."""
    (mount,) = [v for v in service["volumes"] if isinstance(v, dict) and v["target"] == CONFIG_TARGET]
    argv = _argv(service)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    return load_config(DEPLOY / mount["source"], overrides=sets, environ=service["environment"])


def test_the_override_changes_only_the_config_and_the_explorers_endpoint(raw):
    base = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert set(raw["services"]) == set(RFT_SERVICES) <= set(base["services"])
    for name, service in raw["services"].items():
        allowed = {"volumes", "command", "ports", "healthcheck"} if name == "explorer" else {"volumes"}
        assert set(service) <= allowed, f"{name}: the image, restart policy, dependencies stay the base's"
    # the explorer runs the base command (its id and address per container) plus the endpoint's port
    base_script, script = (
        base["services"]["explorer"]["command"][2],
        raw["services"]["explorer"]["command"][2],
    )
    assert script.startswith(base_script) and script[len(base_script) :].split() == [
        "--set", "explorer.serve.port=${SERVE_PORT:-8000}",
    ]  # fmt: skip


def test_every_service_mounts_the_serve_config(merged):
    for name in RFT_SERVICES:
        service = merged[name]
        mounts = [v for v in service["volumes"] if isinstance(v, dict) and v["target"] == CONFIG_TARGET]
        assert len(mounts) == 1, name
        assert mounts[0]["type"] == "bind" and mounts[0]["read_only"] is True
        assert (DEPLOY / mounts[0]["source"]).resolve() == DEPLOY / "config" / "serve.yaml", name
        assert _argv(service)[_argv(service).index("--config") + 1] == CONFIG_TARGET
    for name in ("trainer", "explorer", "synchronizer"):  # the data volume is still theirs
        assert "rft-data:/data" in merged[name]["volumes"], name


def test_the_serve_config_loads_as_each_container_sees_it(merged):
    run = load_config(DEPLOY / "config" / "run.yaml", environ=merged["trainer"]["environment"])
    for name in RFT_SERVICES:
        config = _loaded(merged[name])
        assert config.mode == "serve" and config.trainer.auto_start, name
        # the same services as run.yaml but for the buffer's consumer groups: run.yaml also declares the
        # Node client's group; a serve stack runs without end, so an unread group would fill its buffer
        same = {"buffer": {"consumer_groups"}}
        assert config.services.model_dump(exclude=same) == _loaded_run(merged[name]).services.model_dump(
            exclude=same
        ), f"{name}: same addresses as run.yaml"
        assert config.services.buffer.consumer_groups == ["default"], name
        assert config.services.auth_token == env_example()["RFT_AUTH_TOKEN"]
    # what the `prepare` service writes to the data volume, and the job folder on it; no taskset read
    assert config.model.model_path == run.model.model_path
    assert config.checkpoint_root_dir == run.checkpoint_root_dir and resolve(config).tasksets == []
    assert resolve(config).job_dir != resolve(run).job_dir  # a serve run never resumes the training one


def _loaded_run(service: dict[str, Any]):
    return load_config(DEPLOY / "config" / "run.yaml", environ=service["environment"])


def test_the_endpoint_listens_where_it_is_published_and_probed(merged):
    env = env_example()
    explorer = merged["explorer"]
    config = _loaded(explorer)
    serve, port = config.explorer.serve, int(env["SERVE_PORT"])
    assert (serve.host, serve.port) == ("0.0.0.0", port)
    assert config.services.auth_token, "beyond loopback the endpoint needs the token"
    assert f"{env['PUBLISH_HOST']}:{port}:{port}" in explorer["ports"]
    assert "expose" in explorer and not any(
        str(config.services.explorer.port) in p for p in explorer["ports"]
    )
    test = explorer["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert f'"127.0.0.1:{config.services.explorer.port}"' in test[3]  # gRPC health
    assert f'"http://127.0.0.1:{port}/health"' in test[3]  # the endpoint
    assert {"interval", "timeout", "retries", "start_period"} <= set(explorer["healthcheck"])


def test_images_restart_policies_and_dependencies_are_the_base_ones(merged):
    policies = {name: service.get("restart") for name, service in merged.items()}
    assert policies == {
        "redis": "unless-stopped", "prepare": "no", "synchronizer": "unless-stopped",
        "buffer": "unless-stopped", "trainer": "on-failure", "explorer": "on-failure",
        "autoheal": "unless-stopped",
    }  # fmt: skip
    assert {merged[n]["image"] for n in ("prepare", *RFT_SERVICES)} == {env_example()["RFT_IMAGE"]}
    # the serving explorer keeps the base's label: `autoheal` restarts it when its probe keeps failing
    assert merged["explorer"]["labels"] == {"rft.autoheal": "true"}
    assert merged["explorer"]["depends_on"]["prepare"] == {"condition": "service_completed_successfully"}
    for name in ("synchronizer", "buffer", "trainer"):
        assert "services.common.healthcheck" in merged[name]["healthcheck"]["test"], name


def test_every_variable_is_documented_in_the_env_example(used):
    assert used == {"RFT_SERVE_CONFIG", "SERVE_PORT", "PUBLISH_HOST", "EXPLORER_PORT"}
    assert used <= set(env_example()), used - set(env_example())
    assert env_example()["RFT_SERVE_CONFIG"] == "./config/serve.yaml"


# ------------------------------------------------------------------------------ the explorer's probe
class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args):
        pass


@pytest.fixture
def explorer_ports():
    """A gRPC health service and an HTTP /health on free ports, as a serving explorer has them."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=web.serve_forever, daemon=True)
    thread.start()
    try:
        yield servicer, grpc_port, web
    finally:
        web.shutdown()
        web.server_close()
        server.stop(None)


def _probe(raw, grpc_port: int, http_port: int) -> subprocess.CompletedProcess[str]:
    test = raw["services"]["explorer"]["healthcheck"]["test"]
    script = interpolate(test, {"EXPLORER_PORT": str(grpc_port), "SERVE_PORT": str(http_port)}, set())
    return subprocess.run([sys.executable, *script[2:]], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_probe_passes_only_when_grpc_and_the_endpoint_answer(raw, explorer_ports):
    servicer, grpc_port, web = explorer_ports
    http_port = web.server_address[1]
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    servicer.set("", serving)
    done = _probe(raw, grpc_port, http_port)
    assert done.returncode == 0, done.stderr
    _Health.status = 503
    try:
        assert _probe(raw, grpc_port, http_port).returncode == 1
    finally:
        _Health.status = 200
    servicer.set("", not_serving)
    assert _probe(raw, grpc_port, http_port).returncode == 1
    servicer.set("", serving)
    web.shutdown()
    web.server_close()
    assert _probe(raw, grpc_port, http_port).returncode == 1


# ------------------------------------------------------------------------------------------------- docs
def test_docs_says_how_to_serve_and_talk_to_it():
    readme = (ROOT / "docs" / "serve.md").read_text()
    for needle in (
        "-f deploy/docker-compose.yml -f deploy/docker-compose.serve.yml up -d",
        "SERVE_PORT",
        "/v1/feedback",
        "/v1/commit",
        "kubectl apply -k deploy/k8s-serve",
        "tests/deploy/test_deploy_compose_serve.py",
    ):
        assert needle in readme, needle


# ---------------------------------------------------------------------------------------- compose CLI
def _published(port: Any) -> tuple[str, int, int]:
    """(host ip, published, target) of a port as docker compose v2 (mapping) or v1 (string) prints it."""
    if isinstance(port, dict):
        return port.get("host_ip", ""), int(port["published"]), int(port["target"])
    host, published, target = port.split("/")[0].rsplit(":", 2)
    return host, int(published), int(target)


def test_compose_merges_the_override_with_the_base_file():
    services = merged_services(str(OVERRIDE), "serve")
    for name in RFT_SERVICES:
        mounts = [v for v in services[name]["volumes"] if isinstance(v, dict)]  # v1: "vol:/data:rw" too
        (mount,) = [v for v in mounts if v["target"] == CONFIG_TARGET]
        assert mount["source"] == str(DEPLOY / "config" / "serve.yaml"), name
    explorer = services["explorer"]
    assert [_published(p) for p in explorer["ports"]] == [("127.0.0.1", 8000, 8000)]
    assert explorer["command"][2].endswith("--set explorer.serve.port=8000")
    assert explorer["restart"] == "on-failure" and explorer["image"] == services["trainer"]["image"]
    assert "http://127.0.0.1:8000/health" in explorer["healthcheck"]["test"][3]
