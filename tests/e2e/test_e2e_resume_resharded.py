"""A run trained by two trainer ranks, stopped with SIGINT, resumes with one rank (`trainer.nproc=1` on the
command line): the sharded checkpoint loads on the other size, the run completes to `total_steps`, and the
audit finds every step once and nothing trained twice.

On the way, a wedge: rank 1 is SIGSTOPped mid-run and never resumed. Rank 0 blocks in a real gloo
collective while its event loop keeps answering; its progress (services/common/progress.py: rank 1's
progress record goes stale, rank 0's step stops moving) makes `rft run` call the trainer hung within
`services.progress_timeout`, log the stack of rank 0's stuck thread, and restart the whole trainer group
from its last checkpoint; the run goes on."""

from __future__ import annotations

import json
import os
import re
import signal
import time

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

STEPS, STOP_AT, WEDGE_AT = 8, 4, 2
PROGRESS_S = 20


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
        "trainer": {"nproc": 2, "save_interval": 2},
        "monitor": {"monitor_type": "none"},
        "services": {"progress_timeout": PROGRESS_S},
    }  # fmt: skip
    config = write_config(tmp_path / "run.yaml", tree)
    job = tmp_path / "ckpt" / "e2e" / "reshard"

    log = tmp_path / "first.log"
    first = start_rft(config, log=log)
    metrics, record = job / "metrics" / "trainer.jsonl", job / "progress" / "rank1.json"
    try:
        poll_until(lambda: len(jsonl(metrics)) >= WEDGE_AT and record.is_file() or first.poll() is not None,
                   240, f"step {WEDGE_AT}")  # fmt: skip
        assert first.poll() is None, log.read_text()[-3000:]
        rank1 = json.loads(record.read_text())["pid"]
        os.kill(rank1, signal.SIGSTOP)  # never resumed: the group's restart SIGKILLs it
        wedged_at, done = time.monotonic(), len(jsonl(metrics))
        pattern = (
            r"trainer hung: its event loop answers but its work does not move: (.*); killed and restarted"
        )
        hung = poll_until(
            lambda: re.search(pattern, log.read_text()) or first.poll() is not None, 150, "the wedge"
        )
        found_s = time.monotonic() - wedged_at
        assert first.poll() is None, log.read_text()[-3000:]
        poll_until(
            lambda: "trainer ready at" in log.read_text().split("trainer hung:")[-1], 240, "the trainer back"
        )
        back_s = time.monotonic() - wedged_at
        text = log.read_text()
        assert f"rank 1 (pid {rank1})" in hung.group(1), hung.group(0)
        stack = text[text.index("trainer stuck thread's stack") : text.index("trainer hung:")]
        assert "torch/distributed" in stack and "train_step" in stack, stack  # rank 0 in a real collective
        assert PROGRESS_S <= found_s < PROGRESS_S + 30, found_s
        print(f"wedged rank 1 found in {found_s:.0f} s, trainer group back in {back_s:.0f} s")
        poll_until(lambda: len(jsonl(metrics)) >= done + 2 and jsonl(metrics)[-1]["step"] >= STOP_AT
                   or first.poll() is not None, 240, f"step {STOP_AT} after the restart")  # fmt: skip
        assert first.poll() is None, log.read_text()[-3000:]
        first.send_signal(signal.SIGINT)
        assert first.wait(150) == 130, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert_no_orphans(log.read_text())
    stopped_at = int((job / "latest_checkpointed_iteration.txt").read_text())
    assert stopped_at >= STOP_AT  # saved by the stop itself
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
