"""`rft run` with in-flight weight updates (`explorer.inflight_weight_update: true`, `sync_style:
fully_async`, all four services as processes, memory store, memory weights): versions the trainer
publishes land while the explorer samples, some responses hold tokens of two versions (the explorer's
`rollout/inflight_*` and the trainer's `sample/mixed_version_fraction`, `sample/token_staleness/*`),
the run trains every step and ends cleanly, and `rft audit` finds nothing trained twice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.rft_run import (
    ROOT,
    assert_no_orphans,
    env,
    example,
    jsonl,
    run_rft,
    tiny_model,
    write_config,
)

pytestmark = pytest.mark.slow

STEPS = 6


def test_inflight_run_mixes_versions_within_responses_and_audits_clean(tmp_path):
    tree = example("quickstart.yaml")
    tree.pop("stages")
    tree.update(checkpoint_root_dir=str(tmp_path / "ckpt"), continue_from_checkpoint=False)
    tree["model"].update(model_path=str(tiny_model()), max_response_tokens=96)
    tree["buffer"].update(batch_size=2, total_steps=STEPS)
    tree["explorer"]["inflight_weight_update"] = True
    # long answers (no EOS): each generation spans many decode steps, so publishes land inside them
    tree["explorer"]["rollout_model"]["ignore_eos"] = True
    tree["synchronizer"].update(sync_style="fully_async", sync_interval=1)
    tree["trainer"].update(save_interval=0, save_hf_checkpoint="never")
    tree["monitor"]["monitor_type"] = "none"
    proc = run_rft(write_config(tmp_path / "run.yaml", tree), timeout_s=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)

    run = tmp_path / "ckpt" / "quickstart" / "arithmetic"
    train = jsonl(run / "metrics" / "trainer.jsonl")
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    explore = [r for r in jsonl(run / "metrics" / "explorer.jsonl") if "rollout/reward/mean" in r]
    assert explore
    # versions landed mid-generation, and some responses hold tokens of two versions
    assert sum(r["rollout/inflight_updates"] for r in explore) >= 1, explore
    assert max(r["rollout/inflight_mixed_fraction"] for r in explore) > 0, explore
    # the trainer trained some of them: per-token staleness within the default bound (4 publishes)
    assert max(r["sample/mixed_version_fraction"] for r in train) > 0, train
    assert all(0 <= r["sample/token_staleness/mean"] <= r["sample/token_staleness/max"] <= 4 for r in train)
    assert all(r["sample/token_staleness/mean"] <= r["sample/staleness/mean"] for r in train)
    assert all(r["sample/stale_tokens_masked"] == 0 for r in train)

    audit = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "audit", str(run), "--json"],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout + audit.stderr
    report = json.loads(audit.stdout.strip().splitlines()[-1])
    assert report["steps"] == STEPS and report["trained_twice"] == 0, report
