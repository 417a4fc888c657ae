"""Does the tiny model learn tool use? `rft run` of examples/tool_use.yaml (SFT warm-up on tool-use
transcripts, then GRPO with the `tool_arithmetic` workflow), reading its metrics.

    python bench/tool_use.py [--quick] [--sft-steps N] [--grpo-steps M] [--grpo-lr LR]
                             [--out DIR] [--sft-model HF_DIR]

`--out` keeps the run's checkpoints (the SFT stage's HF export is under
`DIR/ckpt/tool_use/calculator/sft/global_step_N/huggingface`); `--sft-model` starts GRPO from such a
folder without the SFT stage, to compare GRPO settings on one warm-up.

The measured figures, from the GRPO stage's metrics/explorer.jsonl: the reward (1 = right answer,
0.1 = wrong answer after a well-formed calculator call) and the well-formed tool calls per episode,
each as the mean of the first and of the last 5 explore steps. The baseline is the SFT warm-up model
itself (the first GRPO steps sample from it, before any RL update has reached it), so `ratio` =
last reward / first reward (higher = GRPO improved on the warm-up) and `target` = 1.0 (no worse).
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.rft_run import env, jsonl, tiny_model  # noqa: E402


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run, not a measurement)")
    ap.add_argument("--sft-steps", type=int, default=None)
    ap.add_argument("--grpo-steps", type=int, default=None)
    ap.add_argument("--grpo-lr", type=float, default=None, help="the GRPO stage's learning rate")
    ap.add_argument("--out", type=Path, default=None, help="keep the checkpoints here (default: a temp dir)")
    ap.add_argument(
        "--sft-model", type=Path, default=None,
        help="skip the SFT stage and start GRPO from this HF model folder (e.g. an earlier run's export)",
    )  # fmt: skip
    args = ap.parse_args()
    tree = yaml.safe_load((ROOT / "examples" / "tool_use.yaml").read_text())
    sft_steps = args.sft_steps or (30 if args.quick else tree["stages"][0]["buffer"]["total_steps"])
    grpo_steps = args.grpo_steps or (10 if args.quick else tree["buffer"]["total_steps"])
    with tempfile.TemporaryDirectory() as tmp:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            tmp = str(args.out.resolve())
        tree["checkpoint_root_dir"] = str(Path(tmp) / "ckpt")
        tree["model"]["model_path"] = str(tiny_model())
        tree["model"]["chat_template_path"] = str(ROOT / tree["model"]["chat_template_path"])
        tree["buffer"]["total_steps"] = grpo_steps
        tree["stages"][0]["buffer"]["total_steps"] = sft_steps
        if args.grpo_lr:
            tree["algorithm"]["optimizer"]["lr"] = args.grpo_lr
        for section in (
            tree["buffer"]["explorer_input"]["taskset"],
            tree["stages"][0]["buffer"]["trainer_input"]["experience_buffer"],
        ):
            section["path"] = str(ROOT / section["path"])
        if args.sft_model:
            sft_steps = 0
            tree["model"]["model_path"] = str(args.sft_model.resolve())
            grpo = tree.pop("stages")[1]
            for key, value in grpo.items():
                if key != "stage_name":
                    tree[key] = {**tree.get(key, {}), **value} if isinstance(value, dict) else value
        config = Path(tmp) / "tool_use.yaml"
        config.write_text(yaml.safe_dump(tree))
        start = time.monotonic()
        argv = [sys.executable, "-m", "launcher.cli", "run", "--config", str(config)]
        proc = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True)
        seconds = time.monotonic() - start
        if proc.returncode != 0:
            sys.exit(f"rft run failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
        rows = [
            r
            for r in jsonl(
                Path(tmp)
                / "ckpt/tool_use/calculator"
                / ("" if args.sft_model else "grpo")
                / "metrics/explorer.jsonl"
            )
            if "rollout/reward/mean" in r
        ]
    first, last = rows[:5], rows[-5:]
    out = {
        "sft_steps": sft_steps,
        "grpo_steps": grpo_steps,
        "grpo_lr": tree["algorithm"]["optimizer"]["lr"],
        "seconds": round(seconds, 1),
        "reward_first": round(_mean(first, "rollout/reward/mean"), 4),
        "reward_last": round(_mean(last, "rollout/reward/mean"), 4),
        "tool_calls_first": round(_mean(first, "rollout/tool_calls/mean"), 4),
        "tool_calls_last": round(_mean(last, "rollout/tool_calls/mean"), 4),
        "parse_errors_first": round(_mean(first, "rollout/tool_parse_errors/mean"), 4),
        "parse_errors_last": round(_mean(last, "rollout/tool_parse_errors/mean"), 4),
        "reward_curve": [round(r["rollout/reward/mean"], 3) for r in rows],
        "reward_per_10_steps": [
            round(_mean(rows[i : i + 10], "rollout/reward/mean"), 3) for i in range(0, len(rows), 10)
        ],
        "baseline": "the SFT warm-up model (first 5 GRPO steps)",
    }
    out["ratio"] = round(out["reward_last"] / out["reward_first"], 3) if out["reward_first"] > 0 else None
    out["target"] = 1.0
    print(f"{'':<22}{'first 5 steps':>14}{'last 5 steps':>14}")
    for name in ("reward", "tool_calls", "parse_errors"):
        print(f"{name:<22}{out[name + '_first']:>14.3f}{out[name + '_last']:>14.3f}")
    print(f"{sft_steps} SFT + {grpo_steps} GRPO steps in {seconds:.0f}s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
