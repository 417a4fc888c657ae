"""`cluster.colocate` on the CPU with the hf engine: the engine sleeps (its weights leave the device)
after every explore step while the trainer steps, and wakes to load the new weights. The colocated run
gives the same rewards, step by step, as the same run and seed without colocation, and the audit of its
lineage against the buffer's accepted log is clean. (Kills in both phases of a colocated run:
tests/e2e/test_e2e_chaos.py, whose run is colocated.)"""

from __future__ import annotations

import uuid

import pytest
import yaml

from tests.support.chaos import Kill, run_campaign, write_chaos_config
from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.rft_run import assert_no_orphans, jsonl

pytestmark = pytest.mark.slow

TOTAL = 8


@pytest.fixture
def redis_url():
    require_redis_server()
    with RedisServer.start(appendonly=True) as server:
        yield server.url


def _run(tmp_path, redis_url, name: str, colocate: bool, kills: list[Kill]):
    root = tmp_path / name
    root.mkdir()
    config, job = write_chaos_config(
        root, redis_url, total_steps=TOTAL, save_interval=2, prefix=f"{name}-{uuid.uuid4().hex[:6]}"
    )
    tree = yaml.safe_load(config.read_text())
    tree["cluster"] = {"colocate": colocate}
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    campaign = run_campaign(config, job, kills, root / "rft.log", timeout_s=240)
    assert campaign.returncode == 0, campaign.log[-5000:]
    assert_no_orphans(campaign.log)
    audit = campaign.audit
    assert audit.steps == TOTAL and audit.trained_once == TOTAL * 16, audit
    assert (audit.trained_twice, audit.lost, audit.unknown) == (0, 0, 0), audit
    explore = [r for r in jsonl(job / "metrics" / "explorer.jsonl") if "rollout/reward/mean" in r]
    return campaign, explore


@pytest.mark.timeout(600)
def test_colocated_hf_engine_sleeps_every_step_with_the_same_rewards(tmp_path, redis_url):
    _, plain = _run(tmp_path, redis_url, "plain", False, [])
    _, colocated = _run(tmp_path, redis_url, "colocated", True, [])
    assert [r["step"] for r in colocated] == list(range(1, TOTAL + 1))
    assert all(r["rollout/engines_asleep"] == 1.0 for r in colocated)  # slept after every step
    assert all(r["rollout/engines_asleep"] == 0.0 for r in plain)
    assert [r["rollout/reward/mean"] for r in colocated] == [r["rollout/reward/mean"] for r in plain]
    assert [r["rollout/model_version"] for r in colocated] == list(range(TOTAL))  # strictly on-policy
