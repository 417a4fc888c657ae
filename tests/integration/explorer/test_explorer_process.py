"""`python -m services.explorer` as a process: bench mode with `auto_start` evaluates the model and a
saved checkpoint, writes `bench/...` metrics to metrics/explorer.jsonl and stops itself with exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from launcher.tiny_model import make_tiny_model
from services.common.modeling import load_model
from services.explorer.workflows.arithmetic import make_arithmetic_rows

ROOT = Path(__file__).resolve().parents[3]


def test_bench_mode_process_evaluates_checkpoints_and_exits(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model")
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(4, seed=2)))
    job = tmp_path / "ckpt" / "proj" / "run"
    folder = job / "global_step_3" / "huggingface"
    folder.mkdir(parents=True)
    model = load_model(model_dir)
    save_file({n: p.detach().clone() for n, p in model.named_parameters() if n != "lm_head.weight"},
              str(folder / "model.safetensors"))  # fmt: skip
    config = tmp_path / "run.yaml"
    config.write_text(
        f"""
mode: bench
project: proj
name: run
checkpoint_root_dir: {tmp_path}/ckpt
model: {{model_path: {model_dir}, max_response_tokens: 4}}
buffer:
  explorer_input:
    eval_tasksets:
      - {{name: arith, path: {data}, repeat_times: 2, default_workflow_type: arithmetic,
          format: {{prompt_key: question, response_key: answer}}}}
explorer: {{auto_start: true}}
monitor: {{monitor_type: none}}
log: {{format: json}}
"""
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "services.explorer", "--config", str(config), "--explorer-id", "bench-1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (job / "metrics" / "explorer_bench-1.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 3]
    assert all("bench/arith/reward/mean@2" in x and "bench/arith/pass@2" in x for x in lines)
    assert torch.isfinite(torch.tensor([lines[1]["bench/arith/reward/mean@2"]]))
