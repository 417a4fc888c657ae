"""The compose stack with its trainer across two nodes on a real Docker engine: deploy/docker-compose.yml
with the deploy/docker-compose.multinode.yml override, brought up as docs/multi-node.md says, with the
shipped deploy/config/run.yaml changed only in `trainer.total_steps` and `trainer.save_interval`:

1. the two trainer containers meet (torchrun's static rendezvous at `trainer`) and train one 2-rank group:
   steps with rewards, and the checkpoints are sharded (`actor/dcp`, each rank writing its shard to the
   shared volume);
2. node 1's process is SIGKILLed from the host as a dying host ends it: rank 0 fails at its next step,
   both nodes are restarted by their policy, meet again and resume from the last durable checkpoint;
3. the end: both nodes exit 0 and stay down; `rft audit` finds every accepted experience trained once
   or still in the buffer (0 lost, 0 twice);
4. `down -v` leaves nothing of the project.

What it saw is written to ~/.cache/rft-deploy/last-multinode.json.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.compose_stack import DEPLOY, Stack, free_ports, wait_for
from tests.support.docker_engine import CACHE, Engine

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

JOB = "/data/checkpoints/rft-mesh/compose"
TOKEN = "deploy-multinode-token"
FILES = ("docker-compose.yml", "docker-compose.multinode.yml")
TOTAL_STEPS = 40


def _stack(engine: Engine, images: dict[str, str], tmp: Path) -> Stack:
    config = yaml.safe_load((DEPLOY / "config" / "run.yaml").read_text())
    config["trainer"].update(total_steps=TOTAL_STEPS, save_interval=5)
    (tmp / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    names = ("BUFFER_PORT", "EXPLORER_PORT", "TRAINER_PORT", "SYNCHRONIZER_PORT")
    env = {
        "RFT_AUTH_TOKEN": TOKEN,
        **{k: str(v) for k, v in zip(names, free_ports(4), strict=True)},
        "PUBLISH_HOST": "127.0.0.1",
        "RFT_IMAGE": images["RFT_IMAGE"],
        "REDIS_IMAGE": images["REDIS_IMAGE"],
        "RFT_RUN_CONFIG": str(tmp / "run.yaml"),
        "OMP_NUM_THREADS": "1",
    }
    env_file = tmp / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return Stack(engine, "rftdeploytestmultinode", env_file, env, files=FILES, job=JOB)


@pytest.mark.timeout(900)
def test_compose_trainer_across_two_nodes_trains_and_survives_a_node_kill(engine, images, tmp_path):
    stack = _stack(engine, images, tmp_path)
    start = time.monotonic()
    stack.compose("down", "-v", "--remove-orphans")
    try:
        _run(stack, stack.seen)
    except BaseException:
        stack.dump_logs(CACHE / "failed-multinode")
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans")
    left = stack.leftovers()
    stack.seen["wall_s"] = round(time.monotonic() - start)
    (CACHE / "last-multinode.json").write_text(json.dumps(stack.seen, indent=1))
    assert not left, f"`down -v` left {left}"


def _run(stack: Stack, seen: dict[str, Any]) -> None:
    t0 = time.monotonic()
    stack.compose("up", "-d", "--scale", "explorer=1")

    # 1. one group over both nodes: steps with rewards, sharded checkpoints
    def rewarded() -> list[dict[str, Any]]:
        rows = [r for r in stack.trainer_rows() if math.isfinite(r.get("critic/rewards/mean", math.nan))]
        return rows if len(rows) >= 3 else []

    wait_for("3 trainer steps with rewards", rewarded, 300, stack.describe)
    seen["first_steps_s"] = round(time.monotonic() - t0)
    marker = stack.job_dir() / "latest_checkpointed_iteration.txt"
    wait_for("a durable checkpoint", marker.is_file, 240, stack.describe)
    step = int(marker.read_text())
    assert (stack.job_dir() / f"global_step_{step}" / "actor" / "dcp").is_dir(), "not written by 2 ranks"
    assert stack.state("trainer-node1")[0] == "running", stack.describe()

    # 2. node 1 dies: both restart and the run goes on from the last durable checkpoint
    killed_at = stack.max_step()
    assert killed_at < TOTAL_STEPS - 10, "the run is too short to kill a node mid-run"
    stack.sigkill("trainer-node1")
    wait_for(
        "node 1 restarted by its policy", lambda: stack.state("trainer-node1")[2] >= 1, 120, stack.describe
    )
    wait_for("trainer steps past the kill", lambda: stack.max_step() > killed_at + 3, 300, stack.describe)
    seen.update(
        killed_at_step=killed_at, restarts={s: stack.state(s)[2] for s in ("trainer", "trainer-node1")}
    )

    # 3. the end: both nodes exit 0 and stay down; exactly once
    for service in ("trainer", "trainer-node1"):
        wait_for(f"{service} to finish", lambda s=service: stack.state(s)[0] == "exited", 420, stack.describe)
        assert stack.state(service)[:2] == ("exited", 0), stack.describe()
    finished = [json.loads(line) for line in stack.logs(stack.one("trainer")).splitlines()
                if '"run finished"' in line and line.startswith("{")]  # fmt: skip
    assert finished and finished[-1]["step"] == TOTAL_STEPS, stack.describe()
    audit = subprocess.run(
        ["docker", "exec", stack.one("synchronizer"), "rft", "audit", JOB, "--redis-url", "redis://redis:6379/0",
         "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = json.loads(audit.stdout)
    seen["audit"] = report
    assert report["steps"] == TOTAL_STEPS, report
    assert (report["trained_twice"], report["lost"], report["unknown"]) == (0, 0, 0), report
    assert audit.returncode == 0, audit.stderr
    seen["run_s"] = round(time.monotonic() - t0)
