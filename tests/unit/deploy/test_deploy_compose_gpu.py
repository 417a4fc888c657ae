"""The compose GPU override (deploy/docker-compose.gpu.yml) against the code: the trainer and the explorer
run the GPU image on named GPUs, and its default GPUs are Trinity-RFT's placement (the rule `rft run`
and the k8s GPU overlay follow) for the GPU settings of the k8s overlay applied to the compose config.
`docker compose config` (or docker-compose) also merges it with the base file when one is installed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import load_config
from services.common.config.gpus import gpu_demand, place_gpus
from tests.support.compose_file import merged_services

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
_DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")


def _defaults(node: Any) -> Any:
    """The file as compose reads it with none of its variables set (`${VAR:-default}` -> default)."""
    if isinstance(node, dict):
        return {k: _defaults(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_defaults(v) for v in node]
    return _DEFAULT.sub(lambda m: m.group(2), node) if isinstance(node, str) else node


@pytest.fixture(scope="module")
def override() -> dict[str, Any]:
    raw = yaml.safe_load((DEPLOY / "docker-compose.gpu.yml").read_text())
    assert set(re.findall(r"\$\{(\w+)", (DEPLOY / "docker-compose.gpu.yml").read_text())) == {
        "RFT_GPU_IMAGE", "TRAINER_GPUS", "EXPLORER_GPUS",
    }  # fmt: skip
    return _defaults(raw)


def _gpu_sets() -> list[str]:
    """The GPU settings of the k8s GPU overlay (the `--set` values it appends to every service)."""
    values = [op["value"] for op in yaml.safe_load((DEPLOY / "k8s-gpu" / "run-gpu.yaml").read_text())]
    return values[1::2]


def _devices(service: dict[str, Any]) -> dict[str, Any]:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    return device


def test_only_the_trainer_and_the_explorer_take_gpus_and_the_gpu_image(override):
    base = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert set(override["services"]) == {"trainer", "explorer"} <= set(base["services"])
    dockerfile = DEPLOY / "Dockerfile.gpu"
    assert dockerfile.is_file()
    for name, service in override["services"].items():
        assert service["image"] == "rft-mesh:gpu", name
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile.gpu"}, name
        device = _devices(service)
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
        assert "count" not in device, f"{name}: `count` gives every container the first GPUs"
        assert service["shm_size"], name


def test_the_default_gpus_are_the_placement_of_the_gpu_settings(override):
    config = load_config(DEPLOY / "config" / "run.yaml", overrides=_gpu_sets(), environ={})
    placement = place_gpus(config.cluster.gpu_per_node, gpu_demand(config), mode="both")
    ids = lambda gpus: [",".join(str(g) for g in gpus)]  # noqa: E731 - one id string, as Docker joins them
    assert _devices(override["services"]["explorer"])["device_ids"] == ids(placement.explorers[0])
    assert _devices(override["services"]["trainer"])["device_ids"] == ids(placement.trainer)
    assert (placement.explorers[0], placement.trainer) == ((0,), (1,))  # the gsm8k example's split


def test_docs_tells_how_to_place_other_splits():
    readme = (ROOT / "docs" / "gpus.md").read_text()
    for needle in ("docker-compose.gpu.yml", "EXPLORER_GPUS", "TRAINER_GPUS", "gpu_placement"):
        assert needle in readme, needle


def test_compose_merges_the_override_with_the_base_file():
    merged = merged_services(str(DEPLOY / "docker-compose.gpu.yml"), "GPU")
    assert merged["trainer"]["image"] == "rft-mesh:gpu" and merged["buffer"]["image"] != "rft-mesh:gpu"
    assert _devices(merged["explorer"])["device_ids"] == ["0"]
    assert merged["explorer"]["command"]  # the base file's command is kept
