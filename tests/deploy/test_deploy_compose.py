"""The compose stack of deploy/ on a real Docker engine: it trains to the end, scales, survives SIGKILLs.

Images are built without any registry by deploy/build_offline.py (cached under ~/.cache/rft-deploy and
in the engine, so a warm run reuses them). Each scenario brings the stack up from deploy/docker-compose.yml
as a user would (`up -d --scale explorer=2`), with the shipped deploy/config/run.yaml changed only in
`trainer.total_steps`, `trainer.save_interval` and `synchronizer.sync_method`:

1. waits for trainer steps with rewards (the trainer starts on its own: `trainer.auto_start`); in the
   memory scenario the Node.js example client (examples/clients/node) then runs from the host against the
   stack's published ports as docs/compose.md says: it round-trips its 8 experiences through its own
   consumer group (`node-client`, declared in deploy/config/run.yaml) and reads the run state; with a
   wrong token it fails UNAUTHENTICATED (the trainer then trains on what it pushed, which the audit counts);
2. scales to 3 explorers mid-run and waits until the new replica's experiences are in a checkpoint's
   lineage (trained), its metrics file written;
3. SIGKILLs the trainer's process (and, in the memory scenario, then the buffer's), as the kernel's OOM
   killer would: `docker kill` counts as a manual stop, after which no restart policy applies, so the
   test kills the container's main process from the host; the policy restarts it and the run goes on;
4. waits for the end: the trainer exits 0 after `run finished` (`total_steps reached`) and is not
   restarted, every explorer exits 0; `rft audit` (run in the synchronizer's container, against the
   stack's Redis) finds every accepted experience trained once or still in the buffer: 0 lost, 0 twice;
5. `down -v` leaves no container, network or volume of the project.

`nccl` (gloo on CPU) makes the weights cross container boundaries through the broadcast group: no
shared /dev/shm, the group's store on the trainer container's address, the explorers on theirs.
What each scenario saw is written to ~/.cache/rft-deploy/last-<scenario>.json.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.compose_stack import DEPLOY, Stack, free_ports, wait_for
from tests.support.docker_engine import CACHE, Engine
from tests.support.node_client import node_client, run_client

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

JOB = "/data/checkpoints/rft-mesh/compose"  # checkpoint_root_dir/project/name of deploy/config/run.yaml
TOKEN = "deploy-test-token"


@dataclass(frozen=True)
class Scenario:
    sync_method: str
    total_steps: int
    kills: tuple[str, ...]  # services whose main process is SIGKILLed, in order
    node_client: bool = False  # run examples/clients/node against the running stack


SCENARIOS = {
    "memory": Scenario("memory", total_steps=150, kills=("trainer", "buffer"), node_client=True),
    "nccl": Scenario("nccl", total_steps=150, kills=("trainer",)),
}


def _stack(engine: Engine, images: dict[str, str], scenario: Scenario, tmp: Path) -> Stack:
    config = yaml.safe_load((DEPLOY / "config" / "run.yaml").read_text())
    assert config["trainer"].get("auto_start") is True, "the shipped run config must start the trainer"
    config["trainer"].update(total_steps=scenario.total_steps, save_interval=10)
    config["synchronizer"]["sync_method"] = scenario.sync_method
    (tmp / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    names = ("BUFFER_PORT", "EXPLORER_PORT", "TRAINER_PORT", "SYNCHRONIZER_PORT")
    ports = dict(zip(names, free_ports(4), strict=True))
    env = {
        "RFT_AUTH_TOKEN": TOKEN,
        **{k: str(v) for k, v in ports.items()},
        "PUBLISH_HOST": "127.0.0.1",
        "RFT_IMAGE": images["RFT_IMAGE"],
        "REDIS_IMAGE": images["REDIS_IMAGE"],
        "RFT_RUN_CONFIG": str(tmp / "run.yaml"),
        "OMP_NUM_THREADS": "1",
    }
    env_file = tmp / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return Stack(engine, f"rftdeploytest{scenario.sync_method}", env_file, env, job=JOB)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_compose_stack_trains_scales_and_survives_kills(engine, images, name, tmp_path):
    scenario = SCENARIOS[name]
    stack = _stack(engine, images, scenario, tmp_path)
    seen = stack.seen
    seen.update(scenario=name, sync_method=scenario.sync_method, total_steps=scenario.total_steps,
                image_build_s=float(images["build_s"]))  # fmt: skip
    start = time.monotonic()
    stack.compose("down", "-v", "--remove-orphans")  # what a crashed earlier run may have left
    try:
        _run_scenario(stack, scenario, seen)
    except BaseException:
        stack.dump_logs(CACHE / f"failed-{name}")  # every container's whole log, for the post-mortem
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans")
    left = stack.leftovers()
    seen["wall_s"] = round(time.monotonic() - start)
    (CACHE / f"last-{name}.json").write_text(json.dumps(seen, indent=1))
    assert not left, f"`down -v` left {left}"


def _run_scenario(stack: Stack, scenario: Scenario, seen: dict[str, Any]) -> None:
    t0 = time.monotonic()
    stack.compose("up", "-d", "--scale", "explorer=2")
    seen["up_s"] = round(time.monotonic() - t0)

    # 1. trainer steps with rewards
    def rewarded() -> list[dict[str, Any]]:
        rows = [r for r in stack.trainer_rows() if math.isfinite(r.get("critic/rewards/mean", math.nan))]
        return rows if len(rows) >= 3 else []

    rows = wait_for("3 trainer steps with rewards", rewarded, 300, stack.describe)
    seen["first_steps_s"] = round(time.monotonic() - t0)
    seen["first_rewards"] = [round(r["critic/rewards/mean"], 4) for r in rows[:3]]
    if scenario.node_client:
        _node_client_round_trip(stack, seen)

    # 2. a third explorer joins mid-run and its experiences are trained
    before = stack.explorer_ids()
    assert len(before) == 2, before
    stack.compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "explorer=3", "explorer")
    new = {cid: eid for cid, eid in stack.explorer_ids().items() if cid not in before}
    assert len(new) == 1, new
    (new_id,) = new.values()
    seen["scaled_at_step"] = stack.max_step()
    wait_for(f"{new_id}'s experiences in a checkpoint's lineage",
             lambda: new_id in stack.lineage_explorers(), 240, stack.describe)  # fmt: skip
    seen["new_replica_trained_at_step"] = stack.max_step()
    assert (stack.job_dir() / "metrics" / f"explorer_{new_id}.jsonl").is_file()

    # 3. SIGKILL the trainer (then the buffer): each is restarted by its policy and the run goes on
    for service in scenario.kills:
        step = stack.max_step()
        assert step < scenario.total_steps, f"the run ended before {service} was killed: raise total_steps"
        _, _, restarts = stack.state(service)
        stack.sigkill(service)
        wait_for(f"{service} restarted by its policy after SIGKILL",
                 lambda s=service, r=restarts: stack.state(s)[2] > r and stack.state(s)[0] == "running",
                 120, stack.describe)  # fmt: skip
        wait_for(f"trainer steps past {step + 5} after {service} was killed",
                 lambda s=step: stack.max_step() > s + 5, 240, stack.describe)  # fmt: skip
        seen[f"{service}_killed_at_step"] = step

    # 4. the end: the trainer finishes and stays down, every explorer exits 0
    wait_for("the trainer to finish", lambda: stack.state("trainer")[0] == "exited", 420, stack.describe)
    explorers = stack.containers("explorer")
    wait_for("every explorer to exit",
             lambda: all(stack.inspect(c)["State"]["Status"] == "exited" for c in explorers),
             180, stack.describe)  # fmt: skip
    status, code, restarts = stack.state("trainer")
    assert (status, code) == ("exited", 0), stack.describe()
    assert restarts == scenario.kills.count("trainer"), "the finished trainer was restarted"
    codes = {stack.explorer_ids()[c]: stack.inspect(c)["State"]["ExitCode"] for c in explorers}
    assert set(codes.values()) == {0}, codes
    finished = [
        json.loads(line) for line in stack.logs(stack.one("trainer")).splitlines()
        if '"run finished"' in line and line.startswith("{")
    ]  # fmt: skip
    assert finished and finished[-1]["reason"] == "total_steps reached", stack.describe()
    assert finished[-1]["step"] == scenario.total_steps
    seen.update(
        explorers=sorted(codes), explorer_exit_codes=sorted(codes.values()),
        restarts={s: stack.state(s)[2] for s in ("trainer", "buffer", "synchronizer", "redis")},
        final_step=finished[-1]["step"], last_reward=round(stack.trainer_rows()[-1]["critic/rewards/mean"], 4),
    )  # fmt: skip
    assert new_id in stack.lineage_explorers()
    if scenario.sync_method == "nccl":  # the weights crossed the containers through the broadcast group
        joins = {
            stack.explorer_ids()[c]: stack.logs(c).count('"joined weight-sync group"') for c in explorers
        }
        loads = {stack.explorer_ids()[c]: stack.logs(c).count('"weights loaded"') for c in explorers}
        seen.update(group_joins=joins, weight_loads=loads)
        assert all(joins.values()) and all(loads.values()), (joins, loads)

    # exactly once: the buffer's accepted log against the final checkpoint's lineage
    audit = subprocess.run(
        ["docker", "exec", stack.one("synchronizer"), "rft", "audit", JOB, "--redis-url", "redis://redis:6379/0",
         "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = json.loads(audit.stdout)
    seen["audit"] = report
    assert report["steps"] == scenario.total_steps, report
    assert (report["trained_twice"], report["lost"], report["unknown"]) == (0, 0, 0), report
    assert report["produced"] == report["trained_once"] + report["remaining"] and report["ok"], report
    assert audit.returncode == 0, audit.stderr
    seen["run_s"] = round(time.monotonic() - t0)


def _node_client_round_trip(stack: Stack, seen: dict[str, Any]) -> None:
    """docs/compose.md's command (`node examples/clients/node/client.js --buffer 127.0.0.1:$BUFFER_PORT
    --synchronizer 127.0.0.1:$SYNCHRONIZER_PORT --token $RFT_AUTH_TOKEN`) against this stack: 8 of 8
    experiences back through the `node-client` group, the run state read; a wrong token refused."""
    node, why = node_client()
    if node is None:  # the rest of the scenario still runs; the skip is said loudly
        print(f"!!! NODE CLIENT NOT RUN against the compose stack: {why}", file=sys.stderr)
        seen["node_client"] = f"not run: {why}"
        return
    buffer = f"127.0.0.1:{stack.env['BUFFER_PORT']}"
    synchronizer = f"127.0.0.1:{stack.env['SYNCHRONIZER_PORT']}"
    done = run_client(node, "--buffer", buffer, "--synchronizer", synchronizer, "--token", TOKEN)
    assert done.returncode == 0, f"the Node client failed:\n{done.stderr}\n{stack.describe()}"
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True and summary["consumer_group"] == "node-client", summary
    assert summary["put"]["accepted"] == 8 and summary["ours_back"] == 8 and summary["groups_back"] == 2, (
        summary
    )
    assert summary["acked"] == summary["leased"] >= 8, summary
    state = summary["run_state"]
    assert state["sync_method"] == "memory" and state["finished"] is False, state
    assert any(m["role"] == "MEMBER_ROLE_TRAINER" for m in state["members"]), state
    refused = run_client(node, "--buffer", buffer, "--token", "wrong-" + TOKEN, "--no-consume")
    failure = json.loads(refused.stderr.strip().splitlines()[-1])
    assert refused.returncode == 1 and failure["code"] == "UNAUTHENTICATED", refused.stderr
    seen["node_client"] = {
        k: summary[k] for k in ("put", "leases", "leased", "acked", "ours_back", "groups_back")
    }
