"""Crash consistency, for real: a Redis-store run whose buffer, trainer, explorer and synchronizer are
each SIGKILLed once at a seeded random moment (mid-step, mid-save, mid-sync or mid-put). `rft run`
restarts each in place and the run completes at `total_steps`; the audit of the final checkpoint's
lineage against the buffer's accepted log finds nothing lost and nothing trained twice. That run is
colocated (`cluster.colocate`, the hf engine asleep while the trainer steps), so the kills land in both
phases of a colocated run too."""

from __future__ import annotations

import os
import uuid

import pytest
import yaml

from tests.support.chaos import Kill, run_campaign, schedule, write_chaos_config
from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.rft_run import assert_no_orphans, jsonl

pytestmark = pytest.mark.slow

TOTAL = 60
SEED = int(os.environ.get("RFT_CHAOS_SEED", "7"))


@pytest.fixture
def redis_url():
    require_redis_server()
    with RedisServer.start(appendonly=True) as server:
        yield server.url


@pytest.mark.timeout(600)  # the campaign's own deadline (420 s) reports the logs first
def test_every_service_killed_once_nothing_lost_nothing_twice(tmp_path, redis_url):
    config, job = write_chaos_config(
        tmp_path, redis_url, total_steps=TOTAL, save_interval=4, prefix=f"chaos-{uuid.uuid4().hex[:6]}"
    )
    tree = yaml.safe_load(config.read_text())
    tree["cluster"] = {"colocate": True}
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    kills = schedule(SEED, 4, TOTAL)
    assert sorted(k.service for k in kills) == ["buffer", "explorer", "synchronizer", "trainer"]
    campaign = run_campaign(config, job, kills, tmp_path / "rft.log", timeout_s=420)
    out = campaign.log
    assert campaign.returncode == 0, f"seed {SEED}, kills {kills}\n{out[-5000:]}"
    assert_no_orphans(out)
    audit = campaign.audit
    assert audit.steps == TOTAL, audit
    assert audit.trained_once == TOTAL * 16, audit
    assert (audit.trained_twice, audit.lost, audit.unknown) == (0, 0, 0), audit
    assert audit.produced == audit.trained_once + audit.remaining, audit
    assert out.count("restarting") >= len(kills), out[-3000:]
    explored = [r for r in jsonl(job / "metrics" / "explorer.jsonl") if "rollout/engines_asleep" in r]
    assert explored and all(r["rollout/engines_asleep"] == 1.0 for r in explored)  # asleep after each step


@pytest.mark.timeout(450)
def test_memory_store_a_killed_trainer_then_buffer_still_complete(tmp_path):
    """The memory store (`rft run`'s default): a killed trainer takes its consumer over in the living
    buffer; a killed buffer restarts the whole stage (its experiences died with it) and the explorer
    explores those tasks again. Both runs complete, and nothing is trained twice."""
    config, job = write_chaos_config(
        tmp_path, "redis://unused:1/0", total_steps=30, save_interval=4, prefix="m"
    )
    tree = yaml.safe_load(config.read_text())
    tree["services"]["buffer"] = {"store": "memory"}
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    kills = [Kill("trainer", 5, 0.3), Kill("buffer", 12, 0.2)]
    campaign = run_campaign(config, job, kills, tmp_path / "rft.log", timeout_s=300)
    out = campaign.log
    assert campaign.returncode == 0, out[-5000:]
    assert "restarting the stage" in out, out[-3000:]
    audit = campaign.audit
    assert audit.steps == 30 and audit.trained_twice == 0 and audit.produced is None, audit
