"""`rft replay` on a real run: a short Redis-store GRPO run (save_interval 1, replay records kept for
the last 5 steps) whose trainer is SIGKILLed once and restarted by `rft run`. Replaying a step the first
trainer trained, the first step the restarted trainer trained and the last step gives the same weights
bit for bit and the same metrics; a step past the retention exits 2 with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
import yaml

from tests.support.chaos import Kill, run_campaign, write_chaos_config
from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.rft_run import ROOT, env

pytestmark = pytest.mark.slow

TOTAL, KEEP = 6, 5


def rft_replay(job, *steps: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "launcher.cli", "replay", str(job), "--json"]
    argv += [a for s in steps for a in ("--step", str(s))]
    return subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
def test_replayed_steps_match_bit_for_bit_across_a_trainer_kill(tmp_path):
    require_redis_server()
    with RedisServer.start(appendonly=True) as server:
        config, job = write_chaos_config(
            tmp_path, server.url, total_steps=TOTAL, save_interval=1, prefix=f"rp-{uuid.uuid4().hex[:6]}"
        )
        tree = yaml.safe_load(config.read_text())
        tree["trainer"] |= {"max_checkpoints_to_keep": None, "replay_keep_steps": KEEP}
        config.write_text(yaml.safe_dump(tree, sort_keys=False))
        kill = Kill("trainer", 3, 0.0)
        campaign = run_campaign(config, job, [kill], tmp_path / "rft.log", timeout_s=200)
        assert campaign.returncode == 0, campaign.log[-4000:]
        assert campaign.audit.ok and campaign.audit.steps == TOTAL, campaign.audit
    # the restarted trainer took the consumer over at its restored step: its first step comes next
    log = (job / "log" / "trainer.log").read_text().splitlines()
    takeovers = [
        r["step"]
        for r in map(json.loads, filter(lambda s: s.startswith("{"), log))
        if r.get("event") == "buffer consumer taken over"
    ]
    assert len(takeovers) == 2, takeovers
    after_kill = int(takeovers[1]) + 1
    assert TOTAL - KEEP < after_kill <= TOTAL, after_kill
    steps = sorted({TOTAL - KEEP + 1, after_kill, TOTAL})
    replay = rft_replay(job, *steps)
    assert replay.returncode == 0, replay.stdout + replay.stderr[-3000:]
    results = [json.loads(line) for line in replay.stdout.splitlines()]
    assert [r["step"] for r in results] == steps, results
    assert all(r["ok"] and r["tensors"] > 0 and r["metrics_compared"] > 5 for r in results), results
    assert all(r["base"] == r["step"] - 1 for r in results), results  # save_interval 1
    past = rft_replay(job, TOTAL - KEEP)
    assert past.returncode == 2, past.stdout + past.stderr
    assert f"step {TOTAL - KEEP} is past the replay retention" in past.stderr, past.stderr
    assert f"steps {TOTAL - KEEP + 1}..{TOTAL}" in past.stderr, past.stderr
