"""The one-step pipeline, the fully async run and in-flight weight updates: the quickstart's GRPO job with
`sync_offset: 1` and with `sync_style: fully_async` vs strictly on-policy `sync_offset: 0`; and, with a
long tail of response lengths, fully_async with `explorer.inflight_weight_update` vs without.

    python bench/async_pipeline.py [--quick] [--steps N] [--reps R] [--max-tokens T]

All three run `rft run` (memory store, weights by the `nccl` method, `sync_interval: 1`) from the same
warmed-up tiny model (`rft_runs.warm_model`), with the quickstart's settings (8 prompts x 8 samples,
temperature 1.0) but lr 3e-4 (`rft_runs.LR`) and at most `--max-tokens` new tokens. With offset 0 the explorer waits for
step k's weights before it samples step k+1, so sampling and training take turns; with offset 1 it
samples step k+1 on the weights of step k-1 while the trainer trains step k, so the two overlap. With
`fully_async` the explorer never waits: it samples step after step and takes each published version at
its next step boundary; the trainer drops experiences more than 4 versions old (the default bound) and
trains on the oldest fresh enough ones.
Response lengths follow the learning (a run whose policy drifts writes up to 32 tokens, one that learns
writes ~3), so step time also reports trained tokens/s, which does not depend on how long answers got.
Runs alternate (0, 1, fully_async, then the reverse, ...), `--reps` each; figures are medians over
repetitions.
- time per step: from the end of step W to the end of step N (the trainer's `weights sent` events),
  over N - W steps, so start-up and the first steps are out;
- reward after N x 64 samples: the mean reward of the last 5 steps' samples, and the mean over the
  whole run (the reward curve's area); the spread over repetitions of offset 0 is the noise;
- fully_async also reports the mean staleness of what it trained (trainer version - experience
  version) and the experiences dropped as too stale.
Each side's own work per step is reported too (the trainer's update plus gathering and sending the
weights, the explorer's step less its wait for weights): with offset 1 the step time cannot drop below the slower
side's work, and on a machine where both sides share cores each side's work grows when they overlap.
The trainer pipelines its syncs with offset 1 and fully_async (the weights of step k go out while
step k+1 trains).
Long tail (the two `tail` rows): one task in 8 (the same ones every run, by task id) samples exactly
`--long-tokens` tokens (bench/long_tail/long_tail_workflow.py), the others end at EOS or `--max-tokens`,
so each explore step lasts as long as its longest answers. `fully_async tail` takes new weights at its
step boundaries: a version published while it samples waits (with `nccl`, the trainer's broadcast
itself waits for the explorer to reach a boundary); `inflight tail` loads each version between decode
steps (the running answers go on under the new weights). Both report the explorer's idle time per step
(its step less the time it generated: waiting for weights, loading them, sending the batch) and the
staleness of what the trainer trained, per experience and per token.
The last line printed is one JSON object (docs/conventions.md): "ratio" = offset-0 step time / offset-1
step time (higher = faster), "target" 2.0 (offset-1 step time <= 0.5x offset 0),
"fully_async_ratio" = offset-0 step time / fully_async step time, and "inflight_ratio" = fully_async
tail step time / inflight tail step time (its target 1.0: no slower; the issue asks for faster).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos"), str(ROOT / "bench")]

from rft_runs import add_run_args, grpo_config, mean_last, run_plan, run_rft  # noqa: E402

SAMPLES, LAST = 64, 5


LONG_TAIL = ROOT / "bench" / "long_tail"
VARIANTS = {  # name -> grpo_config settings (and `tail`: the long-tail workflow, `inflight`)
    "sync_offset 0": {"sync_offset": 0},
    "sync_offset 1": {"sync_offset": 1},
    "fully_async": {"sync_style": "fully_async"},
    "fully_async tail": {"sync_style": "fully_async", "tail": True},
    "inflight tail": {"sync_style": "fully_async", "tail": True, "inflight": True},
}


def long_tail(cfg: Path, long_tokens: int, inflight: bool) -> None:
    """Turn a `grpo_config` file into its long-tail (and in-flight) variant."""
    tree = yaml.safe_load(cfg.read_text())
    tree["plugin_dirs"] = [str(LONG_TAIL)]
    taskset = tree["buffer"]["explorer_input"]["taskset"]
    taskset["default_workflow_type"] = "long_tail_workflow:LongTailArithmetic"
    taskset["workflow_args"] = {"long_tokens": long_tokens, "long_every": 8}
    tree["model"]["max_model_len"] = max(tree["model"].get("max_model_len") or 0, 8 + long_tokens + 8)
    tree["explorer"]["inflight_weight_update"] = inflight
    cfg.write_text(yaml.safe_dump(tree, sort_keys=False))


def run_once(
    args, work: Path, model: Path, steps: int, warmup: int, variant: str, rep: int
) -> dict[str, float]:
    name = f"{variant.replace(' ', '')}-rep{rep}"
    settings = dict(VARIANTS[variant])
    tail, inflight = settings.pop("tail", False), settings.pop("inflight", False)
    cfg = grpo_config(work / f"{name}.yaml", model=model, root=work / "ck", name=name, steps=steps,
                      sync_interval=1, max_tokens=args.max_tokens, seed=rep, **settings)  # fmt: skip
    if tail:
        long_tail(cfg, args.long_tokens, inflight)
    r = run_rft(cfg, work / "ck" / "bench" / name)
    _, tps, sps = r.window(warmup, SAMPLES)
    # each side's own work per step, waits excluded: the trainer's update plus gathering and sending
    # the weights, the explorer's step less its wait for weights (loading them counts as work)
    trainer_busy = [
        m["timing_s/train_step"] + m.get("timing_s/sync_transfer", 0.0) for m in r.metrics[warmup:]
    ]
    explorer_busy = [m["time/explore_step"] - m.get("time/wait_for_weights", 0.0)
                     for m in r.explorer_metrics[warmup:]]  # fmt: skip
    # idle: the explorer's step less the time it sampled (waits for weights, loads, sending the batch)
    explorer_idle = [m["time/explore_step"] - m["time/run_execution"] for m in r.explorer_metrics[warmup:]]
    return {
        "trainer_busy_s": statistics.median(trainer_busy),
        "explorer_busy_s": statistics.median(explorer_busy) if explorer_busy else float("nan"),
        "s_per_step": sps, "tokens_per_s": tps, "reward_last": mean_last(r.reward, LAST),
        "reward_mean": statistics.fmean(r.reward), "wall_s": r.wall_s,
        "staleness": statistics.fmean(m.get("sample/staleness/mean", 0.0) for m in r.metrics),
        "dropped": r.metrics[-1].get("sample/dropped_stale_total", 0.0),
        "explorer_idle_s": statistics.median(explorer_idle) if explorer_idle else float("nan"),
        "token_staleness": statistics.fmean(m.get("sample/token_staleness/mean", 0.0) for m in r.metrics),
        "mixed": statistics.fmean(m.get("sample/mixed_version_fraction", 0.0) for m in r.metrics),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_args(ap, per="variant", warmup_for="the step time")
    ap.add_argument("--max-tokens", type=int, default=32, help="max new tokens per sample")
    ap.add_argument(
        "--long-tokens", type=int, default=256, help="tokens of the long-tail answers (tail rows)"
    )
    args = ap.parse_args()
    steps, warmup, reps, model = run_plan(args)
    work = Path(tempfile.mkdtemp(prefix="async_pipeline-"))
    names = list(VARIANTS)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in names}
    try:
        for rep in range(reps):
            for variant in names if rep % 2 == 0 else names[::-1]:
                fig = run_once(args, work, model, steps, warmup, variant, rep)
                runs[variant].append(fig)
                print(f"rep {rep} {variant}: {fig['s_per_step']:.3f} s/step {fig['tokens_per_s']:7.0f} tokens/s "
                      f"reward last {fig['reward_last']:.3f} mean {fig['reward_mean']:.3f} staleness "
                      f"{fig['staleness']:.2f} dropped {fig['dropped']:.0f} (process {fig['wall_s']:.0f}s)",
                      flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)

    keys = ("s_per_step", "tokens_per_s", "reward_last", "reward_mean", "wall_s", "staleness", "dropped",
            "trainer_busy_s", "explorer_busy_s", "explorer_idle_s", "token_staleness", "mixed")  # fmt: skip
    med = {v: {k: statistics.median(f[k] for f in runs[v]) for k in keys} for v in names}
    off0 = runs["sync_offset 0"]
    noise = (max(f["reward_mean"] for f in off0) - min(f["reward_mean"] for f in off0)) if reps > 1 else 0.0
    print(f"\nquickstart GRPO, {steps} steps x {SAMPLES} samples (<= {args.max_tokens} tokens), "
          f"step time after {warmup} warm-up steps, median of {reps}")  # fmt: skip
    print(f"{'':15s}{'s/step':>9s}{'tokens/s':>10s}{'reward last':>13s}{'reward mean':>13s}"
          f"{'staleness':>11s}{'dropped':>9s}{'process s':>11s}")  # fmt: skip
    for v in names:
        f = med[v]
        print(f"{v:15s}{f['s_per_step']:9.3f}{f['tokens_per_s']:10.0f}{f['reward_last']:13.3f}"
              f"{f['reward_mean']:13.3f}{f['staleness']:11.2f}{f['dropped']:9.0f}{f['wall_s']:11.1f}")  # fmt: skip
    m0, m1, fa = med["sync_offset 0"], med["sync_offset 1"], med["fully_async"]
    ratio, fa_ratio = m0["s_per_step"] / m1["s_per_step"], m0["s_per_step"] / fa["s_per_step"]
    busy = {v: (med[v]["trainer_busy_s"], med[v]["explorer_busy_s"]) for v in names}
    for v in names:
        print(f"{v:15s} work per step: trainer {busy[v][0]:.3f} s, explorer {busy[v][1]:.3f} s")
    bound = max(busy["sync_offset 1"])  # a pipeline cannot beat the slower side's own work
    print(f"offset 1: step {m1['s_per_step']:.3f} s against the slower side's work {bound:.3f} s "
          f"(hidden: everything but {max(m1['s_per_step'] - bound, 0):.3f} s); offset 0 does both in turn "
          f"({sum(busy['sync_offset 0']):.3f} s of work)")  # fmt: skip
    print(f"offset-1 step time = {1 / ratio:.2f}x offset 0 (target <= 0.5x); fully_async step time = "
          f"{1 / fa_ratio:.2f}x offset 0; reward-mean spread at offset 0 (noise): {noise:.3f}", flush=True)  # fmt: skip
    ft, it = med["fully_async tail"], med["inflight tail"]
    inflight_ratio = ft["s_per_step"] / it["s_per_step"]
    print(f"\nlong tail (1 task in 8 samples {args.long_tokens} tokens): explorer idle per step, staleness "
          "trained (per experience / per token), responses spanning two versions")  # fmt: skip
    for v in ("fully_async tail", "inflight tail"):
        f = med[v]
        print(f"{v:17s}{f['s_per_step']:8.3f} s/step  idle {f['explorer_idle_s']:.3f} s  staleness "
              f"{f['staleness']:.2f} / {f['token_staleness']:.2f}  mixed {f['mixed']:.2f}")  # fmt: skip
    print(f"inflight tail step time = {1 / inflight_ratio:.2f}x fully_async tail", flush=True)
    print(json.dumps({
        "bench": "async_pipeline", "quick": args.quick, "steps": steps, "warmup": warmup, "reps": reps,
        "max_tokens": args.max_tokens,
        "offset1_s_per_step": round(m1["s_per_step"], 4), "offset1_reward_last": round(m1["reward_last"], 4),
        "offset1_reward_mean": round(m1["reward_mean"], 4),
        "offset0_s_per_step": round(m0["s_per_step"], 4), "offset0_reward_last": round(m0["reward_last"], 4),
        "offset0_reward_mean": round(m0["reward_mean"], 4),
        "offset1_tokens_per_s": round(m1["tokens_per_s"], 1),
        "offset0_tokens_per_s": round(m0["tokens_per_s"], 1),
        "tokens_ratio": round(m1["tokens_per_s"] / m0["tokens_per_s"], 3),
        "fully_async_s_per_step": round(fa["s_per_step"], 4),
        "fully_async_tokens_per_s": round(fa["tokens_per_s"], 1),
        "fully_async_reward_last": round(fa["reward_last"], 4),
        "fully_async_reward_mean": round(fa["reward_mean"], 4),
        "fully_async_staleness_mean": round(fa["staleness"], 3), "fully_async_dropped": fa["dropped"],
        "fully_async_ratio": round(fa_ratio, 3),
        "offset0_trainer_busy_s": round(busy["sync_offset 0"][0], 4),
        "offset0_explorer_busy_s": round(busy["sync_offset 0"][1], 4),
        "offset1_trainer_busy_s": round(busy["sync_offset 1"][0], 4),
        "offset1_explorer_busy_s": round(busy["sync_offset 1"][1], 4),
        "offset1_bound_fraction": round(bound / m1["s_per_step"], 3),
        "long_tokens": args.long_tokens,
        "fully_async_tail_s_per_step": round(ft["s_per_step"], 4),
        "fully_async_tail_explorer_idle_s": round(ft["explorer_idle_s"], 4),
        "fully_async_tail_staleness_mean": round(ft["staleness"], 3),
        "inflight_tail_s_per_step": round(it["s_per_step"], 4),
        "inflight_tail_explorer_idle_s": round(it["explorer_idle_s"], 4),
        "inflight_tail_staleness_mean": round(it["staleness"], 3),
        "inflight_tail_token_staleness_mean": round(it["token_staleness"], 3),
        "inflight_tail_mixed_fraction": round(it["mixed"], 3),
        "inflight_ratio": round(inflight_ratio, 3), "inflight_target": 1.0,
        "reward_noise": round(noise, 4), "step_time_fraction": round(1 / ratio, 3),
        "ratio": round(ratio, 3), "target": 2.0,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
