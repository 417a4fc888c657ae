"""Helpers shared by the end-to-end benchmarks (`e2e_vs_trl.py`, `async_pipeline.py`): a warmed-up tiny
model, a one-stage GRPO config derived from `examples/quickstart.yaml`, and one timed `rft run`.

Why a warm-up: a random tiny model never writes the right sum, so every sample of a group has the same
exact-match reward and GRPO has nothing to learn from (the quickstart has an SFT stage for that). The
benchmarks want "reward after N samples" to mean something, so they start every run, ours and the
baseline's, from the same folder: `make_tiny_model` plus a few supervised steps on the right answers
(stopped while the model still answers only some prompts right), saved with `save_pretrained`.

Timing of an `rft run`: the trainer logs `weights sent` (with a timestamp) once per step, after the
optimizer step and the sync; step k's end is that timestamp. Throughput "after warm-up" is the samples of
steps W+1..N over the time from step W's end to step N's end, so process start-up, model loading and
the first steps (allocator growth) are out, as they are for the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
# The benchmarks' learning rate.  The quickstart's 1e-3 is tuned for 4-token answers; with 32 new tokens
# it is unstable from this warm start, for TRL as for RFT Mesh: within a few steps the policy's entropy
# climbs to near uniform and answers run to the token limit, so throughput would measure which run
# happened to diverge.  At 3e-4 both stay stable (answers of ~2-4 tokens) and the reward still moves.
LR = 3e-4
DATA = ROOT / "examples" / "data" / "arithmetic.jsonl"


def warm_model(
    out_dir: Path, sft_steps: int = 30, lr: float = 1e-3, seed: int = 0, size: str = "tiny"
) -> Path:
    """`make_tiny_model` (of `size`) + `sft_steps` full-batch supervised steps on the arithmetic rows
    (prompt + answer + EOS, loss on the answer), as the quickstart's SFT stage does."""
    import torch

    from launcher.tiny_model import make_tiny_model
    from services.common.modeling import load_model, load_tokenizer

    base = out_dir / "base"
    if not (base / "config.json").exists():
        make_tiny_model(base, size=size, seed=seed)
    tok, model = load_tokenizer(str(base)), load_model(str(base), device="cpu")
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    seqs, starts = [], []
    for row in rows:
        p = tok.encode(row["question"], add_special_tokens=False)
        r = tok.encode(str(row["answer"]), add_special_tokens=False) + [tok.eos_token_id]
        seqs.append(p + r)
        starts.append(len(p))
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    labels = ids.clone()
    for i, (s, start) in enumerate(zip(seqs, starts, strict=True)):
        labels[i, :start] = -100
        labels[i, len(s) :] = -100
    mask = (labels != -100) | (torch.arange(width)[None, :] < torch.tensor([len(s) for s in seqs])[:, None])
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(sft_steps):
        loss = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    warm = out_dir / "warm"
    model.save_pretrained(warm)
    tok.save_pretrained(warm)
    return warm


def add_run_args(ap: argparse.ArgumentParser, per: str, warmup_for: str) -> None:
    """The options both end-to-end benchmarks take: --quick, --steps, --warmup, --reps, --size,
    --model-dir."""
    ap.add_argument("--quick", action="store_true", help="fewer steps and repetitions (under 3 minutes)")
    ap.add_argument("--steps", type=int, help="steps per run (default 40, quick 16)")
    ap.add_argument("--warmup", type=int, help=f"steps left out of {warmup_for} (default 5, quick 4)")
    ap.add_argument("--reps", type=int, help=f"runs per {per} (default 3, quick 2)")
    ap.add_argument(
        "--size",
        choices=("tiny", "small"),
        default="tiny",
        help="the model: tiny (~1M parameters) or small (~10M, `rft make-tiny-model --size`)",
    )
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="where the warmed-up model is made (reused when present; default "
                         "runs/bench/model, runs/bench/model-small for --size small)")  # fmt: skip


def run_plan(args: argparse.Namespace) -> tuple[int, int, int, Path]:
    """(steps, warm-up steps, repetitions, warmed-up model folder) from `add_run_args` options."""
    steps = args.steps or (16 if args.quick else 40)
    warmup = args.warmup or (4 if args.quick else 5)
    reps = args.reps or (2 if args.quick else 3)
    folder = args.model_dir or ROOT / "runs" / "bench" / (
        "model" if args.size == "tiny" else f"model-{args.size}"
    )
    model = folder / "warm"
    if not (model / "config.json").exists():
        model = warm_model(folder, size=args.size)
    return steps, warmup, reps, model


def grpo_config(
    path: Path,
    *,
    model: Path,
    root: Path,
    name: str,
    steps: int,
    sync_offset: int = 0,
    sync_interval: int = 1,
    max_tokens: int = 32,
    lr: float = LR,
    temperature: float = 1.0,
    repeat_times: int = 8,
    batch_size: int = 8,
    seed: int = 1,
    sync_method: str = "nccl",
    split_batch: bool = False,
    sync_style: str = "fixed",
) -> Path:
    """The quickstart's GRPO stage as a one-stage run, with the benchmark's settings.

    Weights go trainer -> explorer by `sync_method` "nccl" (a gloo broadcast group on CPU, Trinity-RFT's
    default method): one direct transfer instead of a push to the synchronizer and a pull from it.
    `split_batch`: run with `run_rft(..., explorers=n)` so n explorer processes share each step's
    prompts (`explorer.split_batch`)."""
    tree: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    tree.pop("stages", None)
    tree.update(project="bench", name=name, checkpoint_root_dir=str(root), continue_from_checkpoint=False)
    tree["algorithm"]["repeat_times"] = repeat_times
    tree["algorithm"]["optimizer"]["lr"] = lr
    tree["model"].update(model_path=str(model), max_response_tokens=max_tokens, temperature=temperature)
    tree["buffer"].update(batch_size=batch_size, total_steps=steps)
    taskset = tree["buffer"]["explorer_input"]["taskset"]
    taskset["path"] = str(DATA)
    taskset["data_selector"]["seed"] = seed
    tree["synchronizer"].update(sync_offset=sync_offset, sync_interval=sync_interval, sync_method=sync_method,
                                sync_style=sync_style)  # fmt: skip
    # one micro-batch per step: the default token budget (2 x max_model_len, as Trinity-RFT, sized for
    # GPUs) splits 64 short rows into ~7 forward/backward passes, each paying the model's Python overhead
    tree["trainer"].update(save_interval=0, save_hf_checkpoint="never", max_token_len_per_gpu=4096)
    tree["monitor"]["monitor_type"] = "console"
    tree["explorer"]["split_batch"] = split_batch
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


@dataclass
class RunResult:
    wall_s: float
    step_end_s: list[float]  # seconds since the first step's end, one per step
    reward: list[float]  # mean reward of the samples trained at each step
    tokens: list[float]  # trained tokens (prompt + response) per step
    metrics: list[dict[str, float]]
    explorer_metrics: list[dict[str, float]] = field(default_factory=list)  # explore steps, in order

    def window(self, warmup: int, samples_per_step: int) -> tuple[float, float, float]:
        """(completions/s, trained tokens/s, seconds per step) over steps warmup+1..N."""
        steps = len(self.step_end_s) - warmup
        span = self.step_end_s[-1] - self.step_end_s[warmup - 1]
        return steps * samples_per_step / span, sum(self.tokens[warmup:]) / span, span / steps


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def run_rft(
    config: Path,
    job_dir: Path,
    threads: dict[str, str] | None = None,
    explorers: int = 1,
    python: str | None = None,
) -> RunResult:
    """`rft run --config config [--explorers n]` by `python` (default this interpreter; e.g. .venv-vllm's
    for the vllm engine); per-step figures from the trainer's log and metrics."""
    env = {**os.environ, **(threads or {})}
    t0 = time.perf_counter()
    argv = ["-m", "launcher.cli", "run", "--config", str(config), "--explorers", str(explorers)]
    proc = subprocess.run(
        [python or sys.executable, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"rft run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    ends: dict[int, float] = {}
    for line in (job_dir / "log" / "trainer.log").read_text().splitlines():
        if line.startswith("{") and '"weights sent"' in line:
            event = json.loads(line)
            ends[int(event["step"])] = _stamp(event["timestamp"])
    metrics = [json.loads(x) for x in (job_dir / "metrics" / "trainer.jsonl").read_text().splitlines() if x]
    metrics.sort(key=lambda m: m["step"])
    steps = sorted(ends)
    first = ends[steps[0]]
    explorer = job_dir / "metrics" / "explorer.jsonl"
    explored = [json.loads(x) for x in explorer.read_text().splitlines() if x] if explorer.exists() else []
    return RunResult(
        wall_s=wall,
        step_end_s=[ends[s] - first for s in steps],
        reward=[float(m["critic/score/mean"]) for m in metrics],
        tokens=[float(m["perf/total_num_tokens"]) for m in metrics],
        metrics=metrics,
        explorer_metrics=sorted((m for m in explored if "time/explore_step" in m), key=lambda m: m["step"]),
    )


def mean_last(values: list[float], k: int) -> float:
    return statistics.fmean(values[-k:])


def median(values: list[float]) -> float:
    return statistics.median(values)
