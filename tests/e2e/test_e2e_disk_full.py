"""A full disk under a real run: the Redis-store run's Redis keeps its append-only file on a small tmpfs that
the test fills at step 5. Redis (`appendfsync always`) exits rather than acknowledge a write it cannot
persist; the buffer reports its store unavailable and every client retries. The test frees the space and
starts Redis again on its AOF (a restart policy's job), and the run completes at `total_steps` with the audit
finding nothing lost and nothing trained twice. Needs root to mount the tmpfs; skips loudly otherwise."""

from __future__ import annotations

import uuid

import pytest

from launcher.audit import audit_job
from tests.support.chaos import trainer_steps, write_chaos_config
from tests.support.redis_server import RedisServer, find_redis_server, free_port, require_redis_server
from tests.support.rft_run import assert_no_orphans, poll_until, start_rft
from tests.support.small_disk import SmallDisk

pytestmark = pytest.mark.slow

TOTAL = 24


@pytest.mark.timeout(600)
def test_the_store_disk_fills_mid_run_and_the_run_completes_once_space_returns(tmp_path):
    require_redis_server()
    with SmallDisk.mount(tmp_path / "disk", "64m") as disk:
        if disk is None:
            pytest.skip(f"!!! cannot mount a small tmpfs ({SmallDisk.why_not}): the full-disk run is SKIPPED")
        redis = RedisServer(
            port=free_port(), directory=disk.path, appendonly=True, binary=find_redis_server()
        )
        try:
            redis.launch()
            config, job = write_chaos_config(
                tmp_path, redis.url, total_steps=TOTAL, save_interval=4, prefix=f"disk-{uuid.uuid4().hex[:6]}"
            )
            log = tmp_path / "rft.log"
            proc = start_rft(config, log=log)
            try:
                poll_until(
                    lambda: len(trainer_steps(job)) >= 5 or proc.poll() is not None, 300, "trainer step 5"
                )
                assert proc.poll() is None, log.read_text()[-4000:]
                disk.fill()
                assert redis.process is not None
                code = redis.process.wait(120)  # the next write it cannot persist stops it
                assert code != 0
                stalled_at = len(trainer_steps(job))
                disk.free()
                redis.launch()  # back on its AOF, as a restart policy would start it
                assert proc.wait(400) == 0, log.read_text()[-5000:]
            finally:
                if proc.poll() is None:
                    proc.kill()
            assert_no_orphans(log.read_text())
            audit = audit_job(job, redis_url=redis.url)
        finally:
            redis.stop()
    assert stalled_at < TOTAL
    assert audit.steps == TOTAL and audit.trained_once == TOTAL * 16, audit
    assert (audit.trained_twice, audit.lost, audit.unknown) == (0, 0, 0), audit
    assert audit.produced == audit.trained_once + audit.remaining, audit
