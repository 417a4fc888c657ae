"""Hung services in the compose stack on a real Docker engine: deploy/docker-compose.yml brought up as a
user would, with an override that only shortens the healthcheck window and `autoheal`'s period (the
shipped ones give two minutes), then the trainer, the buffer, the synchronizer and one explorer are each
SIGSTOPped from the host in turn and never resumed:

1. each turns `unhealthy` (its gRPC health check unanswered), `autoheal` restarts that container (a new
   process in the same container, not a restart policy: none acts on health), and the run goes on;
2. no other container is restarted: the services waiting on the stopped one keep answering;
3. Prometheus (deploy/docker-compose.prometheus.yml, the shipped rules with their intervals and the
   stall threshold shortened) scrapes every service; first both explorers are stopped (`compose stop`),
   the backlog drains, the trainer stalls and `RftTrainingStalled` fires, and they are started again;
   then each SIGSTOPped service fires `RftServiceDown` and its restart `RftServiceRestarted`;
4. the run ends by itself at `total_steps` and `rft audit` finds 0 lost, 0 trained twice;
5. `down -v` leaves no container, network or volume of the project.

What it saw is written to ~/.cache/rft-deploy/last-hung.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.compose_stack import DEPLOY, Stack, free_ports, wait_for
from tests.support.docker_engine import CACHE, Engine
from tests.support.prometheus_api import PromApi, prometheus_dir

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

JOB = "/data/checkpoints/rft-mesh/compose"
TOKEN = "deploy-hung-token"
TOTAL_STEPS = 100
# the explorer last: while one of two restarts, the other keeps the run going
ORDER = ("trainer", "buffer", "synchronizer", "explorer")
# the shipped window, shortened: unhealthy after 4 failed checks 2 s apart; autoheal looks every 2 s. A
# check may take 8 s (its Python start on a loaded machine): a tighter timeout made a healthy trainer
# `unhealthy` while other tests ran beside it, and autoheal restarted it
OVERRIDE = {
    "services": {
        **{
            name: {"healthcheck": {"interval": "2s", "timeout": "8s", "retries": 4, "start_period": "60s"}}
            for name in ORDER
        },
        "autoheal": {"command": ["python", "-m", "launcher.autoheal", "--interval", "2", "--grace", "5"]},
    }
}
JOBS = {f"rft-{name}" for name in ORDER}


def _stack(engine: Engine, images: dict[str, str], tmp: Path) -> Stack:
    config = yaml.safe_load((DEPLOY / "config" / "run.yaml").read_text())
    config["trainer"].update(total_steps=TOTAL_STEPS, save_interval=10)
    (tmp / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    rules = prometheus_dir(tmp / "prometheus")
    override = {
        "services": {**OVERRIDE["services"], "prometheus": {"volumes": [f"{rules}:/etc/prometheus:ro"]}}
    }
    (tmp / "hung.yml").write_text(yaml.safe_dump(override, sort_keys=False))
    names = ("BUFFER_PORT", "EXPLORER_PORT", "TRAINER_PORT", "SYNCHRONIZER_PORT", "PROMETHEUS_PORT")
    env = {
        "RFT_AUTH_TOKEN": TOKEN,
        **{k: str(v) for k, v in zip(names, free_ports(len(names)), strict=True)},
        "PUBLISH_HOST": "127.0.0.1",
        "RFT_IMAGE": images["RFT_IMAGE"],
        "REDIS_IMAGE": images["REDIS_IMAGE"],
        "PROMETHEUS_IMAGE": images["PROMETHEUS_IMAGE"],
        "RFT_RUN_CONFIG": str(tmp / "run.yaml"),
        "OMP_NUM_THREADS": "1",
    }
    env_file = tmp / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    # an absolute override path: `DEPLOY / name` keeps it as it is
    files = ("docker-compose.yml", "docker-compose.prometheus.yml", str(tmp / "hung.yml"))
    return Stack(engine, "rftdeploytesthung", env_file, env, files=files)


@pytest.mark.timeout(900)
def test_compose_stack_restarts_each_stopped_service_and_completes(engine, images, tmp_path):
    stack = _stack(engine, images, tmp_path)
    seen = stack.seen
    seen.update(image_build_s=float(images["build_s"]), total_steps=TOTAL_STEPS)
    start = time.monotonic()
    stack.compose("down", "-v", "--remove-orphans")
    try:
        _run(stack, seen)
    except BaseException:
        stack.dump_logs(CACHE / "failed-hung")
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans")
    left = stack.leftovers()
    seen["wall_s"] = round(time.monotonic() - start)
    (CACHE / "last-hung.json").write_text(json.dumps(seen, indent=1))
    assert not left, f"`down -v` left {left}"


def _started(stack: Stack, cid: str) -> tuple[str, int]:
    state = stack.inspect(cid)["State"]
    return state["StartedAt"], state["Pid"]


def _run(stack: Stack, seen: dict[str, Any]) -> None:
    t0 = time.monotonic()
    stack.compose("up", "-d", "--scale", "explorer=2")
    wait_for("3 trainer steps", lambda: stack.max_step() >= 3, 300, stack.describe)
    seen["first_steps_s"] = round(time.monotonic() - t0)
    prom = PromApi(stack.env["PROMETHEUS_PORT"])
    every_target_up = [*sorted((job, "up") for job in JOBS), ("rft-explorer", "up")]
    wait_for("Prometheus to scrape every service", lambda: sorted(prom.targets()) == sorted(every_target_up),
             120, lambda: f"targets: {prom.targets()}")  # fmt: skip
    # every explorer stopped: the trainer takes what the buffer holds, then stalls and the alert fires
    at = time.monotonic()
    stack.compose("stop", "explorer")
    since = lambda: f"{round(time.monotonic() - at) + 2}s"  # noqa: E731
    wait_for("RftTrainingStalled to fire", lambda: prom.fired("RftTrainingStalled", since()), 180,
             lambda: f"{stack.describe()}\nalerts: {prom._get('alerts')}")  # fmt: skip
    seen["stalled_alert_after_s"] = round(time.monotonic() - at, 1)
    stack.compose("start", "explorer")

    watched = [c for c in stack.containers() if stack.inspect(c)["Config"]["Labels"].get("rft.autoheal")]
    before = {cid: _started(stack, cid) for cid in watched}
    paused: list[str] = []
    for service in ORDER:
        step = stack.max_step()
        assert step < TOTAL_STEPS - 20, (
            f"the run is nearly over before {service} was stopped: raise TOTAL_STEPS"
        )
        cid = stack.containers(service)[0]
        started, pid = _started(stack, cid)
        assert pid > 0, f"{service} is not running"
        at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)  # a hang: never resumed
        paused.append(cid)
        wait_for(f"{service} restarted by autoheal after SIGSTOP",
                 lambda c=cid, s=started: _started(stack, c)[0] != s and stack.inspect(c)["State"]["Running"],
                 180, stack.describe)  # fmt: skip
        seen[f"{service}_restarted_after_s"] = round(time.monotonic() - at, 1)
        wait_for(f"trainer steps past {step + 3} after {service} was stopped",
                 lambda s=step: stack.max_step() > s + 3, 300, stack.describe)  # fmt: skip
        seen[f"{service}_stopped_at_step"] = step
    for alert in ("RftServiceDown", "RftServiceRestarted"):
        # the last restarted service is seen restarted once Prometheus has scraped its new process
        fired = lambda a=alert: {labels["job"] for labels in prom.fired(a)}  # noqa: E731
        wait_for(f"{alert} for every stopped service", lambda f=fired: f() >= JOBS, 60,
                 lambda f=fired: f"fired for {sorted(f())}")  # fmt: skip
        seen[f"alert_{alert}"] = sorted(fired())
        assert fired() == JOBS, (alert, fired())

    wait_for("the trainer to finish", lambda: stack.state("trainer")[0] == "exited", 600, stack.describe)
    status, code, _ = stack.state("trainer")
    assert (status, code) == ("exited", 0), stack.describe()
    for cid in watched:  # only the stopped ones were restarted, and no restart policy had to act
        info = stack.inspect(cid)
        assert info["RestartCount"] == 0, (info["Name"], stack.describe())
        if cid not in paused and info["State"]["Running"] and "explorer" not in info["Name"]:
            assert _started(stack, cid)[0] == before[cid][0], f"{info['Name']} was restarted"
    heals = stack.logs(stack.one("autoheal"))
    seen["autoheal_restarts"] = heals.count("is unhealthy")
    assert heals.count("is unhealthy") == len(ORDER), heals
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
