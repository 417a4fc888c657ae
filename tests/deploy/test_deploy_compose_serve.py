"""The compose stack in serve mode on a real Docker engine: deploy/docker-compose.yml with the
deploy/docker-compose.serve.yml override, brought up as docs/serve.md says
(`docker compose -f deploy/docker-compose.yml -f deploy/docker-compose.serve.yml up -d`), with the shipped
deploy/config/serve.yaml changed only in `trainer.total_steps` (2, so the run ends by itself):

1. the explorer's healthcheck (gRPC health and the endpoint's GET /health) turns it healthy, and the
   endpoint answers on the published SERVE_PORT: /health without a token, every other route only with
   the stack's RFT_AUTH_TOKEN (401 without);
2. the `openai` client, as the application, opens two sessions, rewards each choice (POST /v1/feedback)
   and commits them (POST /v1/commit): the trainer trains step 1 on them and the endpoint serves the
   new weights (model_version 1 at /health and in the answers);
3. two more sessions, committed: step 2, the end; the trainer logs `run finished` (`total_steps
   reached`) and exits 0, the explorer exits 0, neither is restarted (restart: on-failure);
4. the final checkpoint's lineage holds exactly the committed sessions' experiences (one per choice,
   none of the session never committed), and the trainer's metrics carry the rewards given;
5. `down -v` leaves no container, network or volume of the project.

What it saw is written to ~/.cache/rft-deploy/last-serve.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import yaml

from services.common.lineage import read_lineage
from tests.support.compose_stack import DEPLOY, Stack, free_ports, wait_for
from tests.support.docker_engine import CACHE, Engine

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

JOB = "/data/checkpoints/rft-mesh/serve"  # checkpoint_root_dir/project/name of deploy/config/serve.yaml
TOKEN = "deploy-serve-token"
FILES = ("docker-compose.yml", "docker-compose.serve.yml")


def _stack(engine: Engine, images: dict[str, str], tmp: Path) -> tuple[Stack, int]:
    config = yaml.safe_load((DEPLOY / "config" / "serve.yaml").read_text())
    assert config["mode"] == "serve" and config["trainer"].get("auto_start") is True
    config["trainer"]["total_steps"] = 2
    (tmp / "serve.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    names = ("BUFFER_PORT", "EXPLORER_PORT", "TRAINER_PORT", "SYNCHRONIZER_PORT", "SERVE_PORT")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    env = {
        "RFT_AUTH_TOKEN": TOKEN,
        **{k: str(v) for k, v in ports.items()},
        "PUBLISH_HOST": "127.0.0.1",
        "RFT_IMAGE": images["RFT_IMAGE"],
        "REDIS_IMAGE": images["REDIS_IMAGE"],
        "RFT_SERVE_CONFIG": str(tmp / "serve.yaml"),
        "OMP_NUM_THREADS": "1",
    }
    env_file = tmp / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return Stack(engine, "rftdeploytestserve", env_file, env, files=FILES, job=JOB), ports["SERVE_PORT"]


@pytest.mark.timeout(600)
def test_compose_serve_stack_trains_on_the_sessions_committed_through_the_published_port(
    engine, images, tmp_path
):
    stack, port = _stack(engine, images, tmp_path)
    seen = stack.seen
    seen.update(image_build_s=float(images["build_s"]), serve_port=port)
    start = time.monotonic()
    stack.compose("down", "-v", "--remove-orphans")  # what a crashed earlier run may have left
    try:
        _run(stack, f"http://127.0.0.1:{port}", seen)
    finally:
        stack.compose("down", "-v", "--remove-orphans")
    left = stack.leftovers()
    seen["wall_s"] = round(time.monotonic() - start)
    (CACHE / "last-serve.json").write_text(json.dumps(seen, indent=1))
    assert not left, f"`down -v` left {left}"


def _session(client: openai.OpenAI, sid: str, rewards: tuple[float, float]) -> tuple[str, int]:
    """Two turns (n=2 on the second: a GRPO group), one reward per choice: (response id, version)."""
    head = {"X-Session-Id": sid}
    msgs = [{"role": "user", "content": "what is 1 plus 2"}]
    first = client.chat.completions.create(model="p", messages=msgs, max_tokens=3, extra_headers=head)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "and 3 plus 4"}]  # fmt: skip
    second = client.chat.completions.create(model="p", messages=msgs, max_tokens=3, n=2, extra_headers=head)
    assert second.model_extra["session_id"] == sid and len(second.choices) == 2
    for i, r in enumerate(rewards):
        client.post("/feedback", body={"response_id": second.id, "choice_index": i, "reward": r},
                    cast_to=httpx2.Response)  # fmt: skip
    return second.id, second.model_extra["model_version"]


def _served_version(base: str) -> int:
    try:
        return int(httpx2.get(f"{base}/health", timeout=5).json()["model_version"])
    except httpx2.HTTPError:
        return -1


def _run(stack: Stack, base: str, seen: dict[str, Any]) -> None:
    t0 = time.monotonic()
    stack.compose("up", "-d")
    seen["up_s"] = round(time.monotonic() - t0)

    # 1. healthy by its own healthcheck; the published endpoint, token required
    wait_for("the explorer's healthcheck to pass", lambda: stack.health("explorer") == "healthy", 180,
             stack.describe)  # fmt: skip
    seen["explorer_healthy_s"] = round(time.monotonic() - t0)
    assert _served_version(base) == 0
    body = {"model": "p", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    refused = httpx2.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 401, refused.text
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=TOKEN, max_retries=0, timeout=120)
    (eid,) = stack.explorer_ids().values()

    def uids(sid: str, rid: str) -> list[str]:
        return [f"{eid}/{eid}/serve/{sid}/{rid}/{i}/" for i in range(2)]

    # 2. two rewarded sessions committed: train step 1, then the endpoint serves version 1
    expected = []
    for sid, rewards in (("a", (1.0, 0.0)), ("b", (0.5, 0.25))):
        rid, version = _session(client, sid, rewards)
        assert version == 0
        expected += uids(sid, rid)
    _session(client, "never-committed", (9.0, 9.0))
    client.post("/commit", body={"session_ids": ["a", "b"]}, cast_to=httpx2.Response)
    wait_for("trainer step 1 on the committed sessions", lambda: stack.max_step() >= 1, 120, stack.describe)
    seen["step_1_s"] = round(time.monotonic() - t0)
    wait_for("version 1 at the endpoint", lambda: _served_version(base) >= 1, 120, stack.describe)
    later = client.chat.completions.create(
        model="p", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert later.model_extra["model_version"] == 1

    # 3. two more: step 2 is total_steps, the run ends and nothing is restarted
    for sid, rewards in (("c", (2.0, 2.0)), ("d", (3.0, 0.0))):
        rid, version = _session(client, sid, rewards)
        assert version == 1
        expected += uids(sid, rid)
    client.post("/commit", body={"session_ids": ["c", "d"]}, cast_to=httpx2.Response)
    for service in ("trainer", "explorer"):
        wait_for(f"the {service} to finish", lambda s=service: stack.state(s)[0] == "exited", 180,
                 stack.describe)  # fmt: skip
        assert stack.state(service) == ("exited", 0, 0), stack.describe()
    seen["finished_s"] = round(time.monotonic() - t0)
    finished = [
        json.loads(line) for line in stack.logs(stack.one("trainer")).splitlines()
        if '"run finished"' in line and line.startswith("{")
    ]  # fmt: skip
    assert finished and finished[-1]["reason"] == "total_steps reached" and finished[-1]["step"] == 2

    # 4. exactly the committed sessions were trained, with the rewards given
    trained = [u for step in read_lineage(stack.job_dir() / "global_step_2") for u in step.uids]
    assert sorted(trained) == sorted(expected)
    rows = stack.trainer_rows()
    assert [r["step"] for r in rows] == [1, 2]
    scores = [[r["critic/score/max"], r["critic/score/min"], r["critic/score/mean"]] for r in rows]
    assert scores[0] == pytest.approx([1.0, 0.0, 1.75 / 4]) and scores[1] == pytest.approx(
        [3.0, 0.0, 7.0 / 4]
    )
    seen.update(explorer_id=eid, trained=len(trained), scores=scores,
                run_s=round(time.monotonic() - t0))  # fmt: skip
