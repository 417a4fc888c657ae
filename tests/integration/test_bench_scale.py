"""The fleet-scale benchmark's core (`bench/scale.py:run_fleet`) against a real buffer (Redis store on a
real redis-server) and a real memory-method synchronizer, both gRPC servers: N = 1 and 2 explorers,
a few steps; every experience put is acked, every version reaches every explorer, after the first as a
delta."""

from __future__ import annotations

import math

import pytest

from bench.scale import FleetParams, in_process_services, run_fleet
from tests.support.redis_server import RedisServer, require_redis_server


@pytest.mark.parametrize("n", [1, 2])
async def test_fleet_runs_and_measures(n, tmp_path):
    require_redis_server()
    p = FleetParams(steps=3, groups=1, tokens_per_s=1e6, weights_mb=0.5)
    with RedisServer.start() as redis:
        async with in_process_services(redis.url, tmp_path, p) as (buffer_addr, sync_addr):
            row = await run_fleet(n, buffer_addr, sync_addr, p)
    assert row["n"] == n
    assert row["acked"] == n * p.steps * 8  # every put experience was leased and acked once
    assert row["experiences_per_s"] > 0
    assert 0 < row["put_p50_ms"] <= row["put_p99_ms"]
    assert 0 <= row["lease_p50_ms"] <= row["lease_p99_ms"]
    # versions 1..steps-1 were pushed; each reached all n explorers (explorer step s needs s - 1)
    assert row["push_s"] > 0 and row["reach_all_s"] >= row["push_s"]
    assert math.isnan(row["sync_cpu_s_per_step"])  # no synchronizer pid: served in this process
    # version 2 differs from version 1 by a simulated step: each explorer pulled it as a delta
    assert row["full_bytes_per_explorer"] == row["payload_bytes"] > 0 and row["delta_fallbacks"] == 0
    assert 0 < row["delta_bytes_per_explorer"] < row["payload_bytes"]
