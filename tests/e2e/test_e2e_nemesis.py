"""The nemesis, short: one fault of each kind (SIGKILL, a pause, a hang, the buffer's Redis link cut both
ways, one way, and slowed; Redis's disk full: it stops, and starts again once the space returns; the job
folder's disk full: checkpoints, logs and metrics cannot be written for a while; the disk faults need
root to mount small disks) at seeded moments of one 40-step Redis-store run
(tests/support/nemesis.py). The
run completes at `total_steps`, training goes on after every fault, and the audit finds nothing lost and
nothing trained twice. `python bench/chaos.py --nemesis 30` runs the long version."""

from __future__ import annotations

import uuid
import warnings

import pytest

from launcher.audit import audit_job
from tests.support.nemesis import DISK_KINDS, KINDS, nemesis_schedule, run_nemesis
from tests.support.redis_server import RedisServer, find_redis_server, free_port, require_redis_server
from tests.support.rft_run import assert_no_orphans
from tests.support.small_disk import SmallDisk

pytestmark = pytest.mark.slow

TOTAL, SEED = 40, 3


@pytest.mark.timeout(700)
def test_one_fault_of_each_kind_nothing_lost_nothing_twice(tmp_path):
    require_redis_server()
    with (
        SmallDisk.mount(tmp_path / "redis-disk", "128m") as disk,
        SmallDisk.mount(tmp_path / "ckpt", "256m") as job_disk,
    ):
        if disk is None or job_disk is None:
            warnings.warn(
                f"!!! no small disks ({SmallDisk.why_not}): the redis_disk and job_disk faults are left out",
                stacklevel=1,
            )
        kinds = KINDS + DISK_KINDS if disk is not None and job_disk is not None else KINDS
        faults = nemesis_schedule(SEED, len(kinds), TOTAL, kinds)
        assert sorted(f.kind for f in faults) == sorted(kinds)
        directory = disk.path if disk is not None else tmp_path / "redis"
        directory.mkdir(exist_ok=True)
        redis = RedisServer(
            port=free_port(), directory=directory, appendonly=True, binary=find_redis_server()
        )
        redis.launch()
        try:
            code, _, job, log = run_nemesis(
                tmp_path, redis, faults, TOTAL, f"nem-{uuid.uuid4().hex[:6]}", 600
            )
            assert code == 0, f"faults {faults}\n{log[-5000:]}"
            audit = audit_job(job, redis_url=redis.url)
        finally:
            redis.stop()
    assert_no_orphans(log)
    assert all(f.recovery_s is not None for f in faults), faults  # training went on after every fault
    assert audit.steps == TOTAL and audit.trained_once == TOTAL * 16, (faults, audit)
    assert (audit.trained_twice, audit.lost, audit.unknown) == (0, 0, 0), (faults, audit)
    assert "hung: no answer" in log, log[-3000:]  # the hang was found by the liveness check
