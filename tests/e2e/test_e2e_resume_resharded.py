"""A run trained by two trainer ranks, stopped with SIGINT, resumes with one rank (`trainer.nproc=1` on the
command line): the sharded checkpoint loads on the other size, the run completes to `total_steps`, and the
audit finds every step once and nothing trained twice."""

from __future__ import annotations

import json
import signal

import pytest

from launcher.audit import audit_job
from tests.support.rft_run import (
    assert_no_orphans,
    jsonl,
    poll_until,
    run_rft,
    start_rft,
    tiny_model,
    write_config,
)

pytestmark = pytest.mark.slow

STEPS, STOP_AT = 8, 3


def test_two_rank_run_resumes_on_one_rank(tmp_path):
    tree = {
        "project": "e2e",
        "name": "reshard",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tiny_model()), "max_response_tokens": 4},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "buffer": {"batch_size": 2, "total_steps": STEPS, "explorer_input": {"taskset": {
            "path": "examples/data/arithmetic.jsonl", "default_workflow_type": "arithmetic",
            "format": {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer"}}}},
        "trainer": {"nproc": 2, "save_interval": 100},
        "monitor": {"monitor_type": "none"},
    }  # fmt: skip
    config = write_config(tmp_path / "run.yaml", tree)
    job = tmp_path / "ckpt" / "e2e" / "reshard"

    log = tmp_path / "first.log"
    first = start_rft(config, log=log)
    try:
        poll_until(lambda: len(jsonl(job / "metrics" / "trainer.jsonl")) >= STOP_AT or first.poll() is not None,
                   240, f"step {STOP_AT}")  # fmt: skip
        assert first.poll() is None, log.read_text()[-3000:]
        first.send_signal(signal.SIGINT)
        assert first.wait(150) == 130, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert_no_orphans(log.read_text())
    stopped_at = int((job / "latest_checkpointed_iteration.txt").read_text())
    assert stopped_at >= STOP_AT  # saved by the stop itself (save_interval is beyond the run)
    assert (job / f"global_step_{stopped_at}" / "actor" / "dcp").is_dir()  # two ranks wrote shards

    second = run_rft(config, "trainer.nproc=1", timeout_s=240)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert_no_orphans(out)
    summary = json.loads((job / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == STEPS
    steps = [r["step"] for r in jsonl(job / "metrics" / "trainer.jsonl")]
    assert steps[-(STEPS - stopped_at) :] == list(range(stopped_at + 1, STEPS + 1))
    audit = audit_job(job)
    # every step's 2 tasks x 2 samples trained once, across both sizes
    assert audit.steps == STEPS and audit.trained_once == STEPS * 2 * 2 and audit.trained_twice == 0, audit
