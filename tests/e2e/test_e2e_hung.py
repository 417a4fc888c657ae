"""Hung services, for real: a Redis-store run whose trainer, buffer, explorer and synchronizer are each
SIGSTOPped in turn and never resumed. `rft run` finds each one silent for `services.liveness_timeout`
(short here), SIGKILLs it and restarts it in place, blaming only the stopped one (the healthy services
waiting on it keep answering); the run completes at `total_steps` and the audit of the final checkpoint's
lineage finds nothing lost and nothing trained twice."""

from __future__ import annotations

import re
import signal
import uuid

import pytest
import yaml

from tests.support.chaos import Kill, run_campaign, write_chaos_config
from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.rft_run import assert_no_orphans

pytestmark = pytest.mark.slow

TOTAL = 40
WINDOW_S = 8
ORDER = ("trainer", "buffer", "explorer", "synchronizer")


@pytest.fixture
def redis_url():
    require_redis_server()
    with RedisServer.start(appendonly=True) as server:
        yield server.url


@pytest.mark.timeout(600)  # the campaign's own deadline (420 s) reports the logs first
def test_each_service_stopped_for_good_is_killed_and_the_run_completes(tmp_path, redis_url):
    config, job = write_chaos_config(
        tmp_path, redis_url, total_steps=TOTAL, save_interval=4, prefix=f"hung-{uuid.uuid4().hex[:6]}"
    )
    tree = yaml.safe_load(config.read_text())
    tree["services"]["liveness_timeout"] = WINDOW_S
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    pauses = [Kill(s, 3 + 7 * i, 0.3, sig=signal.SIGSTOP) for i, s in enumerate(ORDER)]
    campaign = run_campaign(config, job, pauses, tmp_path / "rft.log", timeout_s=420)
    out = campaign.log
    assert campaign.returncode == 0, f"pauses {pauses}\n{out[-5000:]}"
    assert_no_orphans(out)
    hung = re.findall(r"\] (\w+) hung: no answer for (\d+) s[^;]*; killed and restarted", out)
    assert [name for name, _ in hung] == list(ORDER), out[-5000:]
    assert all(WINDOW_S <= int(s) <= WINDOW_S + 3 for _, s in hung), hung
    # only the stopped one is blamed: no healthy peer was restarted for giving up on it
    assert "; restarting (" not in out, out[-5000:]
    audit = campaign.audit
    assert audit.steps == TOTAL, audit
    assert audit.trained_once == TOTAL * 16, audit
    assert (audit.trained_twice, audit.lost, audit.unknown) == (0, 0, 0), audit
    assert audit.produced == audit.trained_once + audit.remaining, audit
    print({p.service: p.resume_s for p in pauses}, hung, f"wall {campaign.wall_s:.0f}s")
