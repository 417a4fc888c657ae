"""`bench/trainer_nodes.py --quick` runs both groups (1 node x 2 ranks, 2 nodes x 1 rank under torchrun) and
ends with the JSON line every benchmark prints (docs/conventions.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.rft_run import ROOT, env

pytestmark = pytest.mark.slow


def test_the_bench_times_both_groups_and_prints_json_last():
    done = subprocess.run([sys.executable, "bench/trainer_nodes.py", "--quick"], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["bench"] == "trainer_nodes" and result["steps"] == 3
    assert result["one_node_s"] > 0 and result["two_nodes_s"] > 0
    assert result["ratio"] == pytest.approx(result["one_node_s"] / result["two_nodes_s"], rel=0.01)
