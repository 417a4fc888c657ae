"""The compose stack with its explorer on vLLM's CPU build, on a real Docker engine: deploy/docker-compose.yml
with the deploy/docker-compose.vllm-cpu.yml override, brought up as deploy/README.md says
(`docker compose -f deploy/docker-compose.yml -f deploy/docker-compose.vllm-cpu.yml up -d`), the explorer
from the image of deploy/Dockerfile.vllm-cpu and every other service from the CPU image, both built without
a registry by `deploy/build_offline.py --engine vllm` (cached under ~/.cache/rft-deploy and in the engine,
so a warm run reuses them). The shipped deploy/config/run.yaml is changed only in `trainer.total_steps`
and `trainer.save_interval`, so the run ends by itself after a few steps:

1. the trainer trains every step on the explorer's rollouts and exits 0 after `run finished`
   (`total_steps reached`); the explorer exits 0; neither is restarted;
2. the explorer generated with vLLM: its log holds vLLM's engine start on the stack's model, and its
   engine core's lines, and every weight version the synchronizer sent was loaded into that engine
   (`weights loaded`, `sync_method: memory`: gRPC streams, then /dev/shm to vLLM's worker);
3. `rft audit` finds every accepted experience trained once or still in the buffer: 0 lost, 0 twice;
4. `down -v` leaves no container, network or volume of the project.

What it saw (the build's and the run's times among it) is written to ~/.cache/rft-deploy/last-vllm.json.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.compose_stack import DEPLOY, IMAGE_TAG, Stack, free_ports, wait_for
from tests.support.docker_engine import CACHE, Engine

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

JOB = "/data/checkpoints/rft-mesh/compose"  # checkpoint_root_dir/project/name of deploy/config/run.yaml
TOKEN = "deploy-vllm-token"
FILES = ("docker-compose.yml", "docker-compose.vllm-cpu.yml")
VLLM_TAG = "rft-mesh:deploy-test-vllm"
TOTAL_STEPS = 4


@pytest.fixture(scope="module")
def vllm_images(engine) -> dict[str, str]:
    """RFT_IMAGE, REDIS_IMAGE and RFT_VLLM_IMAGE from `deploy/build_offline.py --engine vllm` (the CPU image
    is the one the other deploy tests use, cached), and build_s."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(DEPLOY / "build_offline.py"), "--tag", IMAGE_TAG, "--engine", "vllm",
         "--vllm-tag", VLLM_TAG],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, f"deploy/build_offline.py --engine vllm failed:\n{done.stderr[-6000:]}"
    print(done.stderr, file=sys.stderr)
    env = dict(line.split("=", 1) for line in done.stdout.split())
    assert env["RFT_VLLM_IMAGE"] == VLLM_TAG, done.stdout
    env["build_s"] = f"{time.monotonic() - start:.0f}"
    return env


def _stack(engine: Engine, images: dict[str, str], tmp: Path) -> Stack:
    config = yaml.safe_load((DEPLOY / "config" / "run.yaml").read_text())
    assert config["trainer"].get("auto_start") is True, "the shipped run config must start the trainer"
    assert config["synchronizer"]["sync_method"] == "memory"
    config["trainer"].update(total_steps=TOTAL_STEPS, save_interval=2)
    (tmp / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    names = ("BUFFER_PORT", "EXPLORER_PORT", "TRAINER_PORT", "SYNCHRONIZER_PORT")
    env = {
        "RFT_AUTH_TOKEN": TOKEN,
        **{k: str(v) for k, v in zip(names, free_ports(len(names)), strict=True)},
        "PUBLISH_HOST": "127.0.0.1",
        "RFT_IMAGE": images["RFT_IMAGE"],
        "REDIS_IMAGE": images["REDIS_IMAGE"],
        "RFT_VLLM_IMAGE": images["RFT_VLLM_IMAGE"],
        "RFT_RUN_CONFIG": str(tmp / "run.yaml"),
        "OMP_NUM_THREADS": "1",
    }
    env_file = tmp / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return Stack(engine, "rftdeploytestvllm", env_file, env, files=FILES, job=JOB)


@pytest.mark.timeout(3600)  # the images built from nothing (setup) and the run, on two busy cores
def test_compose_stack_trains_with_its_explorer_on_vllm_cpu(engine, vllm_images, tmp_path):
    stack = _stack(engine, vllm_images, tmp_path)
    seen = stack.seen
    seen.update(total_steps=TOTAL_STEPS, image_build_s=float(vllm_images["build_s"]))
    start = time.monotonic()
    stack.compose("down", "-v", "--remove-orphans")  # what a crashed earlier run may have left
    try:
        _run(stack, seen)
    except BaseException:
        stack.dump_logs(CACHE / "failed-vllm")  # every container's whole log, for the post-mortem
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans")
    left = stack.leftovers()
    seen["wall_s"] = round(time.monotonic() - start)
    (CACHE / "last-vllm.json").write_text(json.dumps(seen, indent=1))
    assert not left, f"`down -v` left {left}"


def _json_lines(text: str) -> list[dict[str, Any]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _run(stack: Stack, seen: dict[str, Any]) -> None:
    t0 = time.monotonic()
    stack.compose("up", "-d")
    seen["up_s"] = round(time.monotonic() - t0)
    (explorer,) = stack.containers("explorer")
    image = stack.inspect(explorer)["Config"]["Image"]
    assert image == stack.env["RFT_VLLM_IMAGE"], image
    assert stack.inspect(stack.one("trainer"))["Config"]["Image"] == stack.env["RFT_IMAGE"]

    # 1. the run ends by itself: the trainer finishes, then the explorer
    started = stack.inspect(explorer)["State"]["StartedAt"]

    def first_step() -> bool:
        # restarted by its policy (its engine failed to start) or by autoheal (no answer in time): fail now
        info = stack.inspect(explorer)
        if info["RestartCount"] or info["State"]["StartedAt"] != started:
            pytest.fail(f"the explorer was restarted\n{stack.describe()}")
        return stack.max_step() >= 1

    wait_for("the first trainer step", first_step, 900, stack.describe)
    seen["first_step_s"] = round(time.monotonic() - t0)
    for service in ("trainer", "explorer"):
        wait_for(f"the {service} to finish", lambda s=service: stack.state(s)[0] == "exited", 300,
                 stack.describe)  # fmt: skip
        assert stack.state(service) == ("exited", 0, 0), stack.describe()
    seen["finished_s"] = round(time.monotonic() - t0)
    finished = [r for r in _json_lines(stack.logs(stack.one("trainer"))) if r.get("event") == "run finished"]
    assert finished and finished[-1]["reason"] == "total_steps reached", stack.describe()
    assert finished[-1]["step"] == TOTAL_STEPS
    rows = stack.trainer_rows()
    assert [r["step"] for r in rows] == list(range(1, TOTAL_STEPS + 1)), rows
    rewards = [r.get("critic/rewards/mean", math.nan) for r in rows]
    assert all(math.isfinite(r) for r in rewards), rewards
    seen["rewards"] = [round(r, 4) for r in rewards]

    # 2. the explorer's engine was vLLM's, and it took every weight version the trainer produced
    log = stack.logs(explorer)
    (version,) = re.findall(r"^ARG VLLM_VERSION=(\S+)$", (DEPLOY / "Dockerfile.vllm-cpu").read_text(), re.M)
    engine_start = [line for line in log.splitlines() if "Initializing a V1 LLM engine" in line]
    assert engine_start, log[-6000:]
    start_line = engine_start[0][engine_start[0].index("Initializing") :]
    assert start_line.startswith(
        f"Initializing a V1 LLM engine (v{version}) with config: model='/data/models/tiny'"
    ), start_line[:200]
    assert "(EngineCore pid=" in log, log[-6000:]
    seen["vllm_engine_start"] = start_line[:120]
    loads = [r for r in _json_lines(log) if r.get("event") == "weights loaded"]
    versions = sorted({int(r["version"]) for r in loads})
    seen["weight_versions_loaded"] = versions
    assert versions and versions[-1] >= TOTAL_STEPS - 1, (versions, log[-6000:])
    assert all(r["tensors"] > 0 for r in loads), loads
    (eid,) = stack.explorer_ids().values()
    assert eid in stack.lineage_explorers(), "the final checkpoint trained none of the explorer's experiences"

    # 3. exactly once: the buffer's accepted log against the final checkpoint's lineage
    audit = subprocess.run(
        ["docker", "exec", stack.one("synchronizer"), "rft", "audit", JOB,
         "--redis-url", "redis://redis:6379/0", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = json.loads(audit.stdout)
    seen["audit"] = report
    assert report["steps"] == TOTAL_STEPS, report
    assert (report["trained_twice"], report["lost"], report["unknown"]) == (0, 0, 0), report
    assert report["ok"] and audit.returncode == 0, (report, audit.stderr)
    seen["run_s"] = round(time.monotonic() - t0)
