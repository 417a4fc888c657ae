"""The fan-out benchmark's core (`bench/fanout.py:run_n`) against a real memory-method synchronizer
process and relays in two `bench/relay_fleet.py` processes: N = 5, fanout 2, one timed version per
mode; every relay's payload hash is checked (the first version of each mode) and the figures come out."""

from __future__ import annotations

import argparse
import itertools

from bench.fanout import run_n
from bench.scale import start_service


async def test_fanout_bench_measures_star_and_tree(tmp_path):
    yaml = f"checkpoint_root_dir: {tmp_path}\nsynchronizer:\n  sync_method: memory\nlog:\n  level: WARNING\n"
    proc, port = start_service("synchronizer", yaml, tmp_path)
    args = argparse.Namespace(procs=2, fanout=2, weights_mb=0.25, chunk_kb=32, reps=1)
    try:
        row = await run_n(5, args, f"127.0.0.1:{port}", proc.pid, itertools.count(1))
    finally:
        proc.kill()
        proc.wait()
    assert (row["n"], row["depth"]) == (5, 2)
    assert row["star_reach_all_s"] > 0 and row["tree_reach_all_s"] > 0 and row["ratio"] > 0
    assert row["star_sync_cpu_s"] >= 0 and row["tree_relay_cpu_s"] >= 0
