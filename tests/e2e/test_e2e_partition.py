"""Partitions and slow links, for real: a Redis-store run whose buffer reaches its Redis through a proxy
(tests/support/netproxy.py) that cuts the link both ways for 20 s, then one way (replies held) for 15 s,
then delays every chunk by 1 s for 15 s, healing after each. Nothing tells either side the link is gone
(no reset): the buffer's calls stall, the trainer's and explorers' calls to the buffer time out and are
retried, held commands land late. The run completes at `total_steps`, and the audit of the final
checkpoint's lineage against the buffer's accepted log finds nothing lost and nothing trained twice
(a late put is not stored twice, a lease is held by one trainer)."""

from __future__ import annotations

import time
import uuid

import pytest

from launcher.audit import audit_job
from tests.support.chaos import trainer_steps, write_chaos_config
from tests.support.netproxy import NetProxy
from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.rft_run import assert_no_orphans, poll_until, start_rft

pytestmark = pytest.mark.slow

TOTAL = 30
FAULTS = (("cut", "both", 20.0), ("cut", "down", 15.0), ("delay", 1.0, 15.0))  # (kind, arg, seconds)


@pytest.mark.timeout(600)
def test_a_partitioned_and_slow_store_link_loses_nothing_and_trains_nothing_twice(tmp_path):
    require_redis_server()
    with RedisServer.start(appendonly=True) as redis, NetProxy.start("127.0.0.1", redis.port) as proxy:
        config, job = write_chaos_config(
            tmp_path, f"redis://127.0.0.1:{proxy.port}/0", total_steps=TOTAL, save_interval=4,
            prefix=f"part-{uuid.uuid4().hex[:6]}",
        )  # fmt: skip
        log = tmp_path / "rft.log"
        proc = start_rft(config, log=log)
        seen = []
        try:
            for n, (kind, arg, seconds) in enumerate(FAULTS):
                at = 3 + 6 * n
                poll_until(lambda a=at: len(trainer_steps(job)) >= a or proc.poll() is not None, 300,
                           f"trainer step {at}")  # fmt: skip
                assert proc.poll() is None, log.read_text()[-4000:]
                before = len(trainer_steps(job))
                proxy.cut(arg) if kind == "cut" else proxy.delay(arg)
                time.sleep(seconds)  # ok-sleep: the length of the injected fault
                during = len(trainer_steps(job)) - before
                proxy.heal()
                seen.append((kind, arg, before, during))
            assert proc.wait(300) == 0, log.read_text()[-5000:]
        finally:
            if proc.poll() is None:
                proc.kill()
        out = log.read_text()
        assert_no_orphans(out)
        assert proxy.connections >= 1  # the buffer's Redis traffic went through the proxy
        # a cut store link stalls training (a step needs a lease, which needs Redis): at most the step
        # in flight when it fell ends during the cut
        assert all(during <= 1 for kind, _, _, during in seen if kind == "cut"), seen
        audit = audit_job(job, redis_url=redis.url)
    assert audit.steps == TOTAL and audit.trained_once == TOTAL * 16, (seen, audit)
    assert (audit.trained_twice, audit.lost, audit.unknown) == (0, 0, 0), (seen, audit)
    assert audit.produced == audit.trained_once + audit.remaining, audit
