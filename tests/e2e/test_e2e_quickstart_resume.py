"""The main job, interrupted: the quickstart (memory store, `save_interval` larger than the GRPO steps
done so far) stopped with SIGINT mid-GRPO and started again with the same command completes. The
trainer saved its last step on the way out, the explorer resumed at the trainer's step, and the final
checkpoint's lineage holds every step exactly once."""

from __future__ import annotations

import json
import signal

import pytest

from launcher.audit import audit_job
from tests.support.rft_run import (
    assert_no_orphans,
    example,
    jsonl,
    poll_until,
    run_rft,
    start_rft,
    tiny_model,
    write_config,
)

pytestmark = pytest.mark.slow

SFT_STEPS, RL_STEPS, STOP_AT = 8, 30, 12


def test_quickstart_sigint_mid_grpo_then_the_same_command_completes(tmp_path):
    tree = example("quickstart.yaml")
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"]["total_steps"] = RL_STEPS
    tree["stages"][0]["buffer"]["total_steps"] = SFT_STEPS
    assert tree["trainer"]["save_interval"] > STOP_AT  # nothing saved mid-GRPO but by the stop itself
    config = write_config(tmp_path / "quickstart.yaml", tree)
    rl = tmp_path / "ckpt" / "quickstart" / "arithmetic" / "grpo"

    log = tmp_path / "first.log"
    first = start_rft(config, log=log)
    try:
        poll_until(lambda: len(jsonl(rl / "metrics" / "trainer.jsonl")) >= STOP_AT or first.poll() is not None,
                   240, f"GRPO step {STOP_AT}")  # fmt: skip
        assert first.poll() is None, log.read_text()[-3000:]
        first.send_signal(signal.SIGINT)
        assert first.wait(150) == 130, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert_no_orphans(log.read_text())
    stopped_at = int((rl / "latest_checkpointed_iteration.txt").read_text())
    assert stopped_at >= STOP_AT  # the trainer saved its last step on SIGINT

    second = run_rft(config, timeout_s=240)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert_no_orphans(out)
    summary = json.loads((tmp_path / "ckpt" / "quickstart" / "arithmetic" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == SFT_STEPS + RL_STEPS
    steps = [r["step"] for r in jsonl(rl / "metrics" / "trainer.jsonl")]
    assert steps[-(RL_STEPS - stopped_at) :] == list(range(stopped_at + 1, RL_STEPS + 1))
    audit = audit_job(rl)
    assert audit.steps == RL_STEPS and audit.trained_twice == 0, audit
    explorer_log = (rl / "log" / "explorer.log").read_text()
    assert "resumed" in explorer_log
