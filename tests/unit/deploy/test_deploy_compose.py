"""The compose stack in deploy/ checked against the code, without Docker: every service exists, runs a real
module with a config that exists and loads, is probed by the gRPC health probe on the port it really
listens on (config + .env defaults + compose interpolation agree), depends on healthy neighbours, the
explorer can scale, Redis keeps an AOF, and the images copy what the commands need.

`docker compose config` (or docker-compose v1) also validates the file when either is installed (on a fresh
CI machine neither is, until tests/deploy installs the engine and runs the stack for real)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import load_config
from tests.support.compose_file import env_example as _env_example
from tests.support.compose_file import interpolate as _interpolate
from tests.support.docker_engine import compose_cli

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
RFT_SERVICES = ("synchronizer", "buffer", "trainer", "explorer")
CONFIG_TARGET = "/etc/rft/run.yaml"


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def compose(raw) -> dict[str, Any]:
    """The compose file as `docker compose` sees it with deploy/.env copied from .env.example."""
    used: set[str] = set()
    resolved = _interpolate(raw, _env_example(), used)
    resolved["_used_vars"] = used
    return resolved


def _command_module(command: list[str] | str) -> tuple[str, list[str]]:
    """(module, argv after it) of the `python -m services.X ...` a service runs, also inside `sh -c`."""
    argv = command if isinstance(command, list) else shlex.split(command)
    if argv[:2] == ["sh", "-c"]:
        argv = shlex.split(argv[2].split("exec ", 1)[1])
    assert argv[:2] == ["python", "-m"], argv
    return argv[2], argv[3:]


def _listen_port(service: dict[str, Any], name: str) -> int:
    """The port the service listens on: the mounted config with the container's RFT_* environment."""
    config = load_config(DEPLOY / "config" / "run.yaml", environ=service["environment"])
    return getattr(config.services, name).port


def test_every_service_of_the_stack_is_there(raw):
    assert set(raw["services"]) == {"redis", "prepare", "autoheal", *RFT_SERVICES}
    assert set(raw["volumes"]) >= {"redis-data", "rft-data"}


def test_commands_run_real_modules_with_the_mounted_config(compose):
    for name in RFT_SERVICES:
        service = compose["services"][name]
        module, args = _command_module(service["command"])
        assert module == f"services.{name}", (name, module)
        main = ROOT / Path(*module.split(".")) / "__main__.py"
        assert main.is_file(), (
            f"{name}: {main.relative_to(ROOT)} does not exist (the service has no entry point)"
        )
        assert args[args.index("--config") + 1] == CONFIG_TARGET
        mounts = [v for v in service["volumes"] if isinstance(v, dict) and v["target"] == CONFIG_TARGET]
        assert len(mounts) == 1 and mounts[0]["read_only"] is True and mounts[0]["type"] == "bind"
        assert (DEPLOY / mounts[0]["source"]).resolve() == DEPLOY / "config" / "run.yaml"
    prepare = compose["services"]["prepare"]["command"]
    assert prepare[:2] == ["python", "deploy/prepare.py"] and (ROOT / prepare[1]).is_file()


def test_the_explorer_takes_a_unique_id_per_replica(compose):
    explorer_main = (ROOT / "services" / "explorer" / "__main__.py").read_text()
    assert '"--explorer-id"' in explorer_main  # how the explorer takes its id
    command = compose["services"]["explorer"]["command"]
    script = command[2]
    assert '--explorer-id "explorer-$(hostname)"' in script
    assert 'RFT_EXPLORER_ADDRESS="$(hostname):$RFT_EXPLORER_PORT"' in script


def test_the_explorer_can_scale(raw):
    explorer = raw["services"]["explorer"]
    assert "container_name" not in explorer and "ports" not in explorer and "hostname" not in explorer
    assert "deploy" not in explorer or "replicas" not in explorer["deploy"]


def test_healthchecks_probe_the_port_each_service_listens_on(compose):
    env = _env_example()
    for name in RFT_SERVICES:
        service = compose["services"][name]
        port = _listen_port(service, name)
        assert port == int(env[f"{name.upper()}_PORT"]), name
        assert service["healthcheck"]["test"] == [
            "CMD", "python", "-m", "services.common.healthcheck", f"127.0.0.1:{port}",
        ]  # fmt: skip
        for published in service.get("ports", []):
            host, host_port, container_port = published.rsplit(":", 2)
            assert (host, int(host_port), int(container_port)) == (env["PUBLISH_HOST"], port, port), name
    assert (ROOT / "services" / "common" / "healthcheck.py").is_file()
    assert compose["services"]["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_the_config_alone_agrees_with_the_env_defaults():
    """Without any RFT_* variables the mounted config listens on the .env.example ports too."""
    config = load_config(DEPLOY / "config" / "run.yaml", environ={})
    env = _env_example()
    for name in RFT_SERVICES:
        endpoint = getattr(config.services, name)
        assert endpoint.host == "0.0.0.0" and endpoint.port == int(env[f"{name.upper()}_PORT"]), name
        if name != "explorer":
            assert endpoint.target == f"{name}:{endpoint.port}"


def test_services_find_each_other_by_compose_name(compose):
    names = set(compose["services"])
    for name in RFT_SERVICES:
        service = compose["services"][name]
        config = load_config(DEPLOY / "config" / "run.yaml", environ=service["environment"])
        s = config.services
        assert s.auth_token == _env_example()["RFT_AUTH_TOKEN"]
        assert s.buffer.store == "redis" and s.buffer.redis_url.startswith("redis://redis:6379")
        for peer in ("buffer", "trainer", "synchronizer"):
            endpoint = getattr(s, peer)
            host, port = endpoint.target.rsplit(":", 1)
            assert host in names and int(port) == endpoint.port, (name, peer, endpoint.target)
        assert "/data/" in config.model.model_path and config.checkpoint_root_dir.startswith("/data")


def test_the_token_is_required(raw):
    token = raw["x-rft-env"]["RFT_AUTH_TOKEN"]
    assert token.startswith("${RFT_AUTH_TOKEN:?"), "compose must refuse to start without a token"


def test_dependencies_wait_for_healthy_neighbours(compose):
    services = compose["services"]
    expected = {
        "buffer": {"redis": "service_healthy"},
        "trainer": {"prepare": "service_completed_successfully", "buffer": "service_healthy",
                    "synchronizer": "service_healthy"},
        "explorer": {"prepare": "service_completed_successfully", "buffer": "service_healthy",
                     "synchronizer": "service_healthy"},
    }  # fmt: skip
    for name, deps in expected.items():
        got = {dep: spec["condition"] for dep, spec in services[name]["depends_on"].items()}
        assert got == deps, name
        for dep, condition in deps.items():
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}, which has no healthcheck"


def test_redis_keeps_an_append_only_file_on_a_volume(compose, raw):
    redis = compose["services"]["redis"]
    assert redis["image"].split(":")[0] == "redis" and redis["image"].split(":")[1].startswith("7")
    assert raw["services"]["redis"]["image"] == "${REDIS_IMAGE:-redis:7}"
    command = redis["command"]
    assert command[0] == "redis-server" and command[command.index("--appendonly") + 1] == "yes"
    # the AOF lands on the volume, and other containers may connect, whichever Redis build runs
    assert command[command.index("--dir") + 1] == "/data" and "redis-data:/data" in redis["volumes"]
    assert command[command.index("--protected-mode") + 1] == "no"


def test_the_run_ends_by_itself_and_stays_ended(compose):
    """The trainer and explorers start on their own and exit 0 at the end: `on-failure` restarts them
    after a crash only; the stores and the synchronizer stay up."""
    config = load_config(DEPLOY / "config" / "run.yaml", environ={})
    assert config.trainer.auto_start and config.explorer.auto_start and config.mode == "both"
    policies = {name: service.get("restart") for name, service in compose["services"].items()}
    assert policies == {
        "redis": "unless-stopped", "prepare": "no", "synchronizer": "unless-stopped",
        "buffer": "unless-stopped", "trainer": "on-failure", "explorer": "on-failure",
        "autoheal": "unless-stopped",
    }  # fmt: skip


def test_a_hung_service_is_restarted_by_autoheal(compose, raw):
    """Compose restarts on exits only: a stopped or wedged service (its gRPC health check unanswered)
    turns unhealthy after about two minutes, and `autoheal` restarts the labelled containers of its own
    project through the Docker socket, with a short grace (a stopped process never acts on SIGTERM)."""
    services = compose["services"]
    for name in RFT_SERVICES:
        health = services[name]["healthcheck"]
        assert services[name]["labels"] == {"rft.autoheal": "true"}, name
        window = health["retries"] * _seconds(health["interval"])
        assert 100 <= window <= 180, (name, window)  # `services.liveness_timeout`'s 120 s, give or take
        assert _seconds(health["timeout"]) < _seconds(health["interval"]), name
    assert "labels" not in services["redis"] and "labels" not in services["prepare"]
    autoheal = services["autoheal"]
    argv = autoheal["command"]
    assert argv[:3] == ["python", "-m", "launcher.autoheal"]
    assert int(argv[argv.index("--grace") + 1]) <= 30
    assert (ROOT / "launcher" / "autoheal.py").is_file()
    assert autoheal["volumes"] == ["/var/run/docker.sock:/var/run/docker.sock"]
    assert raw["services"]["autoheal"]["volumes"] == [
        "${DOCKER_SOCKET:-/var/run/docker.sock}:/var/run/docker.sock"
    ]
    assert autoheal["user"] == "root" and autoheal["image"] == services["trainer"]["image"]
    assert "autoheal" in (ROOT / "docs" / "compose.md").read_text()


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, duration
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def test_the_offline_build_stages_what_the_dockerfile_copies():
    """deploy/build_offline.py sends the legacy builder (which reads no Dockerfile.dockerignore) only
    what that file lets in, which is what the Dockerfile copies."""
    import runpy

    script = runpy.run_path(str(DEPLOY / "build_offline.py"), run_name="build_offline")
    entries = set(script["_context_entries"]())
    assert entries == {
        "pyproject.toml", "README.md", "protos", "services", "launcher", "tinker_api", "deploy/prepare.py"
    }  # fmt: skip
    copied = {
        src.rstrip("/")
        for line in _instructions(DEPLOY / "Dockerfile") if line.startswith("COPY ")
        for src in line.split()[1:-1]
    }  # fmt: skip
    assert copied <= entries


def test_every_variable_is_documented_in_the_env_example(compose):
    documented = set(_env_example())
    assert compose["_used_vars"] <= documented, compose["_used_vars"] - documented


def _instructions(path: Path) -> list[str]:
    text = path.read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_cpu_image_copies_what_the_commands_need(raw):
    for name in ("prepare", *RFT_SERVICES):
        build = raw["services"][name]["build"]
        assert build == {"context": "..", "dockerfile": "deploy/Dockerfile"}, name
    lines = _instructions(DEPLOY / "Dockerfile")
    # python:3.11-slim unless deploy/build_offline.py passes its local base (no registry needed)
    assert lines[:2] == ["ARG BASE_IMAGE=python:3.11-slim", "FROM ${BASE_IMAGE}"]
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):  # BuildKit would fetch a frontend image
        assert not (DEPLOY / dockerfile).read_text().startswith("# syntax="), dockerfile
    text = "\n".join(lines)
    torch_at = text.index('"torch==${TORCH_VERSION}"')
    assert (
        "ARG TORCH_VERSION=2.13.0" in text
        and "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    )
    assert '--index-url "${TORCH_INDEX_URL}"' in text
    # the project with its `tinker` extra (docker-compose.tinker.yml runs the Tinker API server)
    assert torch_at < text.index('pip install ".[tinker]" '), "CPU torch must be installed before the project"
    _check_copies(text, DEPLOY / "Dockerfile.dockerignore")


def test_the_gpu_image_adds_the_vllm_extra():
    assert re.search(r"^vllm = \[", (ROOT / "pyproject.toml").read_text(), re.M), "no `vllm` extra"
    lines = _instructions(DEPLOY / "Dockerfile.gpu")
    assert lines[0] == "FROM python:3.11-slim"
    text = "\n".join(lines)
    # the versions scripts/test.sh resolves (requirements/constraints-vllm.txt), not a free resolve
    assert 'pip install -c requirements/constraints-vllm.txt ".[vllm]"' in text
    assert "download.pytorch.org/whl/cpu" not in text
    _check_copies(text, DEPLOY / "Dockerfile.gpu.dockerignore")


def _check_copies(dockerfile: str, dockerignore: Path) -> None:
    readme = re.search(r'^readme = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    copied = {
        src for line in dockerfile.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]
    }
    needed = {"services/", "launcher/", "protos/", "pyproject.toml", readme.group(1), "deploy/prepare.py"}
    assert needed <= copied, needed - copied
    for src in copied:
        assert (ROOT / src).exists(), src
    allowed = {line[1:].strip() for line in dockerignore.read_text().splitlines() if line.startswith("!")}
    assert copied <= allowed, f"{dockerignore.name} keeps {copied - allowed} out of the build context"
    assert "*" in dockerignore.read_text().splitlines()


def test_docs_says_how_to_configure_run_and_scale():
    readme = (ROOT / "docs" / "compose.md").read_text()
    for needle in (
        "cp deploy/.env.example deploy/.env",
        "--scale explorer=",
        "RFT_AUTH_TOKEN",
        "Dockerfile.gpu",
    ):
        assert needle in readme, needle
    assert ".env" in (DEPLOY / ".gitignore").read_text().split()


def test_docker_compose_config_accepts_the_file():
    cli = compose_cli()
    if cli is None:
        pytest.skip(
            "neither `docker compose` nor `docker-compose` is installed; the structural tests cover it"
        )
    done = subprocess.run(
        [*cli, "--env-file", str(DEPLOY / ".env.example"), "-f", str(DEPLOY / "docker-compose.yml"),
         "config", "--quiet"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
