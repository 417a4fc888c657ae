"""End to end: the same GRPO job run by RFT Mesh (`rft run`) and by TRL's `GRPOTrainer`, side by side.

    python bench/e2e_vs_trl.py [--quick] [--size tiny|small] [--steps N] [--reps R] [--trl-python PATH]
                               [--vllm-python PATH | --no-vllm] [--vllm-explorers N] [--gpu]

The job: the tiny Qwen2 of `rft make-tiny-model` (`--size small`: its ~10M-parameter one) warmed up
on the right answers (`rft_runs.warm_model`; both sides start from that same folder), the a+b prompts
of `examples/data/arithmetic.jsonl`, the exact-match reward `arithmetic_reward` (1 for the right
number, 0 otherwise; TRL calls the same function,
compiled from the product's source), 8 prompts per step x 8 samples (`repeat_times` = `num_generations`
= 8), at most 32 new tokens, temperature 1.0, learning rate 3e-4 (constant; `rft_runs.LR` says why not
1e-3), no KL (`beta=0`), on CPU.
- RFT Mesh: `rft run` with the memory store, strictly on-policy (`sync_offset: 0`, `sync_interval: 1`,
  weights by the `nccl` method: a gloo broadcast on CPU), the `hf` rollout engine, two explorer
  processes that share each step's 8 prompts (`--explorers 2`, `explorer.split_batch`: sampling
  runs on both cores while the trainer waits; the trainer has them while the explorers wait), so
  five processes; each has one torch thread.
- RFT Mesh on vLLM: the same `rft run` with `explorer.rollout_model.engine_type: vllm`, run by the vLLM
  environment's interpreter (`--vllm-python`, default .venv-vllm/bin/python: `bash scripts/setup.sh
  --engine vllm`; vLLM's CPU build here), `--vllm-explorers` explorer processes (default 1), each with
  its engine: the explorer, vLLM's engine core and its worker, one torch thread each. One, not two as
  for hf: vLLM's worker busy-polls its shared-memory queue for 1 s after each message it reads
  (`SpinCondition.busy_loop_s` in vllm/distributed/device_communicators/shm_broadcast.py), so while
  the trainer updates, each engine's worker holds a core; two of them on 2 cores starve the trainer
  (tiny model: 0.87 s/step with two engines, 0.37 s with one). Left out without that environment or
  with `--no-vllm`.
- TRL: `GRPOTrainer` in one process (no vLLM; defaults otherwise: loss "dapo", one iteration), with
  one torch thread (`--trl-threads`), as `rft run` gives each of its processes (OMP_NUM_THREADS=1 on a
  2-core machine); with 2 threads TRL was 2-25x slower here whenever other work shared the cores.
- `--gpu`: both sides on the first GPU: `rft run` with the one-GPU placement of
  `examples/quickstart_one_gpu.yaml` (`cluster.gpu_per_node: 1`, trainer and one hf explorer share
  cuda:0), TRL's `GRPOTrainer` on cuda with bf16 (`trl_grpo_worker.py --device cuda`); no vLLM run.
Runs alternate (ours, TRL, ours on vLLM, then the reverse order, ...), `--reps` each; figures are medians
over repetitions.
Completions/s and trained tokens/s (prompt + completion) count steps after `--warmup` (start-up, model
load and the first steps are out on both sides); reward is the mean reward of the samples of the last 5
steps of N, i.e. after the same number of samples on both sides.

TRL is a benchmark-only dependency, in its own virtualenv (default `.venv-bench`, git-ignored). When it
is missing the benchmark creates it with the CPU torch pin (about a minute, 1.5 GB), which is:

    python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 && .venv-bench/bin/pip install trl

The last line printed is one JSON object (docs/conventions.md): "ratio" = our completions/s / TRL's,
"target" 3.0 (the goal of the scale work; 2.0 before it); with the vLLM run also `rft_vllm_*` figures and
"vllm_ratio" = its completions/s / TRL's (the same run's TRL).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos"), str(ROOT / "bench")]

from rft_runs import DATA, LR, add_run_args, grpo_config, mean_last, run_plan, run_rft  # noqa: E402

GROUP, PROMPTS, MAX_TOKENS, TEMPERATURE = 8, 8, 32, 1.0
SAMPLES = GROUP * PROMPTS
LAST = 5  # reward: mean of the last LAST steps' samples
TARGET = 3.0


def ensure_trl(python: Path) -> Path:
    if python.exists():
        return python
    venv = python.parent.parent
    print(f"TRL virtualenv missing: creating {venv} (torch==2.13.0 CPU, then trl)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "trl"], check=True)
    return python


def run_trl(
    python: Path, model: Path, steps: int, work: Path, threads: int, seed: int, device: str = "cpu"
) -> dict:
    out = work / "trl.json"
    t0 = time.perf_counter()
    subprocess.run(
        [str(python), str(ROOT / "bench" / "trl_grpo_worker.py"), "--model", str(model), "--data", str(DATA),
         "--steps", str(steps), "--out", str(out), "--lr", str(LR), "--temperature", str(TEMPERATURE),
         "--group", str(GROUP), "--prompts", str(PROMPTS), "--max-tokens", str(MAX_TOKENS),
         "--threads", str(threads), "--seed", str(seed), "--device", device],
        cwd=ROOT, check=True, capture_output=True, text=True,
    )  # fmt: skip
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


def trl_figures(r: dict, warmup: int) -> dict[str, float]:
    ends, cum = r["step_end_s"], r["num_tokens"]
    span = ends[-1] - ends[warmup - 1]
    steps = len(ends) - warmup
    return {
        "completions_per_s": steps * SAMPLES / span,
        "tokens_per_s": (cum[-1] - cum[warmup - 1]) / span,
        "s_per_step": span / steps,
        "reward": mean_last(r["reward"], LAST),
        "wall_s": r["wall_s"],
    }


def rft_figures(
    config: Path, job_dir: Path, warmup: int, explorers: int, python: str | None = None
) -> dict[str, float]:
    r = run_rft(config, job_dir, explorers=explorers, python=python)
    cps, tps, sps = r.window(warmup, SAMPLES)
    return {"completions_per_s": cps, "tokens_per_s": tps, "s_per_step": sps,
            "reward": mean_last(r.reward, LAST), "wall_s": r.wall_s}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_args(ap, per="side", warmup_for="throughput")
    ap.add_argument("--trl-python", type=Path, default=ROOT / ".venv-bench" / "bin" / "python")
    ap.add_argument(
        "--trl-threads",
        type=int,
        default=1,
        help="TRL's torch threads (1, as `rft run` gives each process: 2 thrash on a shared 2-core box)",
    )
    ap.add_argument("--explorers", type=int, default=2,
                    help="explorer processes sharing each step's prompts (explorer.split_batch)")  # fmt: skip
    ap.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python",
                    help="the vLLM environment's interpreter, for the run on the vllm engine")  # fmt: skip
    ap.add_argument("--no-vllm", action="store_true", help="leave the run on the vllm engine out")
    ap.add_argument("--gpu", action="store_true",
                    help="both sides on cuda:0 (one-GPU placement; TRL in bf16); implies --no-vllm")  # fmt: skip
    ap.add_argument("--vllm-explorers", type=int, default=1,
                    help="explorer processes of the vllm run, each with an engine (module docstring)")  # fmt: skip
    args = ap.parse_args()
    python = ensure_trl(args.trl_python)
    if args.gpu:
        args.no_vllm, args.explorers = True, 1  # one hf engine shares the GPU with the trainer
    vllm = not args.no_vllm and args.vllm_python.exists()
    if not args.no_vllm and not vllm:
        print(
            f"the vllm run is left out: no {args.vllm_python} (bash scripts/setup.sh --engine vllm)",
            flush=True,
        )
    vllm_explorers = args.vllm_explorers
    sides = ("rft", "trl", "vllm") if vllm else ("rft", "trl")
    steps, warmup, reps, model = run_plan(args)
    work = Path(tempfile.mkdtemp(prefix="e2e_vs_trl-"))
    ours: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    on_vllm: list[dict[str, float]] = []
    try:
        for rep in range(reps):
            order = sides if rep % 2 == 0 else sides[::-1]
            for side in order:
                if side in ("rft", "vllm"):
                    name = f"rep{rep}" if side == "rft" else f"vllm-rep{rep}"
                    n = args.explorers if side == "rft" else vllm_explorers
                    cfg = grpo_config(work / f"{name}.yaml", model=model, root=work / "ck", name=name,
                                      steps=steps, sync_offset=0, max_tokens=MAX_TOKENS, lr=LR,
                                      temperature=TEMPERATURE, repeat_times=GROUP, batch_size=PROMPTS,
                                      seed=rep, split_batch=n > 1)  # fmt: skip
                    if side == "vllm" or args.gpu:
                        tree = yaml.safe_load(cfg.read_text())
                        if side == "vllm":
                            tree["explorer"]["rollout_model"]["engine_type"] = "vllm"
                        if args.gpu:  # examples/quickstart_one_gpu.yaml's placement
                            tree.setdefault("cluster", {}).update(node_num=1, gpu_per_node=1)
                        cfg.write_text(yaml.safe_dump(tree, sort_keys=False))
                    rows = ours if side == "rft" else on_vllm
                    interpreter = str(args.vllm_python) if side == "vllm" else None
                    rows.append(rft_figures(cfg, work / "ck" / "bench" / name, warmup, n, python=interpreter))
                    fig = rows[-1]
                else:
                    device = "cuda" if args.gpu else "cpu"
                    trl = run_trl(python, model, steps, work, args.trl_threads, rep, device)
                    base.append(trl_figures(trl, warmup))
                    fig = base[-1]
                print(f"rep {rep} {side:4s} {fig['completions_per_s']:8.1f} completions/s "
                      f"{fig['tokens_per_s']:8.0f} tokens/s {fig['s_per_step']:6.3f} s/step "
                      f"reward {fig['reward']:.3f} (process {fig['wall_s']:.0f}s)", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    keys = ("completions_per_s", "tokens_per_s", "s_per_step", "reward", "wall_s")
    o = {k: med(ours, k) for k in keys}
    b = {k: med(base, k) for k in keys}
    v = {k: med(on_vllm, k) for k in keys} if on_vllm else None
    print(f"\nGRPO, {args.size} Qwen2, {steps} steps x {SAMPLES} samples (<= {MAX_TOKENS} tokens), "
          f"throughput after {warmup} warm-up steps, median of {reps}")  # fmt: skip
    print(f"{'':18s}{'completions/s':>15s}{'tokens/s':>12s}{'s/step':>9s}{'reward':>9s}{'process s':>11s}")
    table = [("RFT Mesh (hf)", o), ("TRL", b)] + ([("RFT Mesh (vllm)", v)] if v else [])
    for label, f in table:
        print(f"{label:18s}{f['completions_per_s']:15.1f}{f['tokens_per_s']:12.0f}{f['s_per_step']:9.3f}"
              f"{f['reward']:9.3f}{f['wall_s']:11.1f}")  # fmt: skip
    ratio = o["completions_per_s"] / b["completions_per_s"]
    print(f"ratio (completions/s, ours / TRL): {ratio:.2f}x   target {TARGET}x", flush=True)
    extra: dict[str, object] = {}
    if v:
        vratio = v["completions_per_s"] / b["completions_per_s"]
        print(f"ratio on the vllm engine (completions/s, ours / TRL): {vratio:.2f}x", flush=True)
        extra = {
            "rft_vllm_completions_per_s": round(v["completions_per_s"], 2),
            "rft_vllm_tokens_per_s": round(v["tokens_per_s"], 1),
            "rft_vllm_s_per_step": round(v["s_per_step"], 4),
            "rft_vllm_reward": round(v["reward"], 4), "rft_vllm_process_s": round(v["wall_s"], 1),
            "vllm_explorers": vllm_explorers, "vllm_ratio": round(vratio, 3),
        }  # fmt: skip
    print(json.dumps({
        "bench": "e2e_vs_trl", "quick": args.quick, "size": args.size, "steps": steps, "warmup": warmup, "reps": reps,
        "samples_per_step": SAMPLES, "max_completion_length": MAX_TOKENS,
        "rft_completions_per_s": round(o["completions_per_s"], 2), "rft_tokens_per_s": round(o["tokens_per_s"], 1),
        "rft_s_per_step": round(o["s_per_step"], 4), "rft_reward": round(o["reward"], 4),
        "trl_completions_per_s": round(b["completions_per_s"], 2), "trl_tokens_per_s": round(b["tokens_per_s"], 1),
        "trl_s_per_step": round(b["s_per_step"], 4), "trl_reward": round(b["reward"], 4),
        "tokens_ratio": round(o["tokens_per_s"] / b["tokens_per_s"], 3),
        "reward_delta": round(o["reward"] - b["reward"], 4),
        "trl_threads": args.trl_threads, "explorers": args.explorers, "device": "cuda" if args.gpu else "cpu",
        **extra,
        "ratio": round(ratio, 3), "target": TARGET,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
