"""`rft run` on a shortened quickstart (SFT warm-up stage, then GRPO with all four services as
processes): the reward rises, checkpoints and the HF export exist and load, summary.json is complete,
the final lines name the checkpoint, summary.json and curves.png, every metric/log file is where the
README says, and no process is left behind."""

from __future__ import annotations

import json

import pytest
import torch

from services.common.modeling import load_model
from tests.support.rft_run import (
    SUMMARY_KEYS,
    assert_no_orphans,
    example,
    jsonl,
    run_rft,
    tiny_model,
    write_config,
)

pytestmark = pytest.mark.slow

SFT_STEPS, RL_STEPS = 32, 60


def test_quickstart_learns_and_leaves_a_loadable_checkpoint(tmp_path):
    tree = example("quickstart.yaml")
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"]["total_steps"] = RL_STEPS
    tree["stages"][0]["buffer"]["total_steps"] = SFT_STEPS
    config = write_config(tmp_path / "quickstart.yaml", tree)

    proc = run_rft(config, timeout_s=290)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)

    run_dir = tmp_path / "ckpt" / "quickstart" / "arithmetic"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert all(summary.get(k) is not None for k in SUMMARY_KEYS), summary
    assert summary["status"] == "finished"
    assert summary["steps"] == SFT_STEPS + RL_STEPS
    assert [s["stage_name"] for s in summary["stages"]] == ["sft", "grpo"]
    # the final lines name the checkpoint, the summary and the curves (both stages on one step axis)
    final = proc.stdout.strip().splitlines()[-4:]
    assert final[0].startswith(f"rft run: finished: {SFT_STEPS + RL_STEPS} steps, reward "), final
    assert final[1:] == [f"checkpoint: {summary['checkpoint']}", f"summary: {run_dir / 'summary.json'}",
                         f"plot: {run_dir / 'curves.png'}"]  # fmt: skip
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"

    rl = run_dir / "grpo"
    explore = [r for r in jsonl(rl / "metrics" / "explorer.jsonl") if "rollout/reward/mean" in r]
    train = jsonl(rl / "metrics" / "trainer.jsonl")
    assert [r["step"] for r in explore] == list(range(1, RL_STEPS + 1))
    assert [r["step"] for r in train] == list(range(1, RL_STEPS + 1))
    assert all("actor/pg_loss" in r for r in train)
    sft = jsonl(run_dir / "sft" / "metrics" / "trainer.jsonl")
    assert [r["step"] for r in sft] == list(range(1, SFT_STEPS + 1))
    assert sft[-1]["actor/pg_loss"] < sft[0]["actor/pg_loss"] / 2  # the SFT loss fell
    for service in ("synchronizer", "buffer", "trainer", "explorer"):
        assert (rl / "log" / f"{service}.log").stat().st_size > 0

    # learning: the mean of the last 10 explore steps beats the first 10 by a clear margin
    rewards = [r["rollout/reward/mean"] for r in explore]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, f"reward did not rise: first 10 steps {first:.3f}, last 10 {last:.3f}"
    assert summary["first_reward_mean"] == pytest.approx(rewards[0])
    assert summary["last_reward_mean"] == pytest.approx(sum(rewards[-5:]) / 5)

    # checkpoints: the marker names the last step; the HF export loads and runs
    assert (rl / "latest_checkpointed_iteration.txt").read_text().strip() == str(RL_STEPS)
    assert summary["checkpoint"] == str(rl / f"global_step_{RL_STEPS}" / "huggingface")
    model = load_model(summary["checkpoint"])
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits).all()
    # the RL stage started from the SFT stage's export
    rl_config = (rl / "config.yaml").read_text()
    assert str(run_dir / "sft" / f"global_step_{SFT_STEPS}" / "huggingface") in rl_config
