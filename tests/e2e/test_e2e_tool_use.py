"""`rft run` of a shortened examples/tool_use.yaml: an SFT warm-up on tool-use transcripts, then GRPO
with the `tool_arithmetic` workflow on the tiny model, all four services as processes. The model's
`<tool_call>` blocks reach the hermes parser and the calculator (`rollout/tool_calls` > 0), episodes
with a call have two model turns, and the checked-in data is what its generator writes.
Whether GRPO then raises the reward takes longer than a test: bench/tool_use.py measures it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.rft_run import ROOT, assert_no_orphans, example, jsonl, run_rft, tiny_model, write_config

pytestmark = pytest.mark.slow

SFT_STEPS, RL_STEPS = 60, 4


def test_generator_writes_the_checked_in_data(tmp_path):
    script = ROOT / "examples" / "data" / "make_tool_arithmetic.py"
    subprocess.run([sys.executable, str(script), "--out-dir", str(tmp_path)], check=True, capture_output=True)
    for name in ("tool_arithmetic.jsonl", "tool_arithmetic_sft.jsonl"):
        assert (tmp_path / name).read_text() == (ROOT / "examples" / "data" / name).read_text(), name


def test_tool_use_parses_the_models_calls_and_answers_them(tmp_path):
    tree = example("tool_use.yaml")
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"]["total_steps"] = RL_STEPS
    tree["stages"][0]["buffer"]["total_steps"] = SFT_STEPS
    config = write_config(tmp_path / "tool_use.yaml", tree)

    proc = run_rft(config, timeout_s=420)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)

    run_dir = tmp_path / "ckpt" / "tool_use" / "calculator"
    sft = jsonl(run_dir / "sft" / "metrics" / "trainer.jsonl")
    assert len(sft) == SFT_STEPS and sft[-1]["actor/pg_loss"] < sft[0]["actor/pg_loss"] / 4
    explore = [
        r for r in jsonl(run_dir / "grpo" / "metrics" / "explorer.jsonl") if "rollout/reward/mean" in r
    ]
    assert [r["step"] for r in explore] == list(range(1, RL_STEPS + 1))
    calls = [r["rollout/tool_calls/mean"] for r in explore]
    assert max(calls) > 0, f"no tool call was parsed: {calls}"
    # an episode with a call answers in a second turn (`turns` is averaged per task, then over tasks)
    assert max(r["rollout/turns/max"] for r in explore) > 1.0
    assert all("rollout/tool_parse_errors/mean" in r for r in explore)
