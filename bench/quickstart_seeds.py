"""Does the quickstart learn on every data order? `rft run` of examples/quickstart.yaml once per data seed.

    python bench/quickstart_seeds.py [--seeds 1 2 3 4 5] [--grpo-steps N] [--set KEY=VALUE ...]

Each run is the shipped config as `scripts/quickstart.sh` runs it (SFT warm-up, then GRPO), on the
tiny model (`rft make-tiny-model`, model seed 0), with only `buffer.explorer_input.taskset.
data_selector.seed` changed. Per seed it reads the run's `summary.json`: the GRPO stage's first explore
step (the SFT model: the baseline, measured in the same run) and the mean of its last five explore
steps, and the whole run's wall time. Runs go one after another (two cores). The last line printed is
one JSON object: per seed figures, "ratio" = the worst seed's final reward / 0.9 and "target" 1.0
(every seed ends at >= 0.9), plus "worst_time_ratio" = 180 s / the slowest run (target 1.0: each run
under 3 minutes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.rft_run import env, tiny_model  # noqa: E402

GOAL_REWARD, GOAL_SECONDS = 0.9, 180.0


def apply_overrides(tree: dict, overrides: list[str]) -> None:
    """`a.b.c=VALUE` (VALUE read as YAML) sets tree["a"]["b"]["c"], creating missing sections; a
    number indexes a list (`stages.1.algorithm.optimizer.lr=2e-3`: the second stage's)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"--set {item!r}: expected dotted.key=value, e.g. algorithm.optimizer.lr=2e-3")
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[int(leaf) if isinstance(node, list) else leaf] = yaml.safe_load(value)


def run_seed(
    seed: int, work: Path, grpo_steps: int | None, overrides: list[str], stream: bool = False
) -> dict[str, float]:
    """One `rft run`; `stream`: its progress lines go to this process's output as they come (a run cut
    off by a timeout still shows how far it got), else they are kept for the failure message."""
    tree = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    apply_overrides(tree, overrides)
    tree["checkpoint_root_dir"] = str(work / f"seed{seed}")
    tree["continue_from_checkpoint"] = False
    tree["model"]["model_path"] = str(tiny_model())
    taskset = tree["buffer"]["explorer_input"]["taskset"]
    taskset["path"] = str(ROOT / taskset["path"])
    taskset["data_selector"]["seed"] = seed
    if grpo_steps:
        tree["buffer"]["total_steps"] = grpo_steps
    for stage in tree.get("stages", []):
        eb = stage.get("buffer", {}).get("trainer_input", {}).get("experience_buffer")
        if eb and "path" in eb:
            eb["path"] = str(ROOT / eb["path"])
    config = work / f"seed{seed}.yaml"
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    start = time.monotonic()
    argv = [sys.executable, "-m", "launcher.cli", "run", "--config", str(config)]
    run_env = {**env(), "PYTHONUNBUFFERED": "1"} if stream else env()
    proc = subprocess.run(argv, cwd=ROOT, env=run_env, capture_output=not stream, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        output = "" if stream else (proc.stdout + proc.stderr)[-3000:]
        sys.exit(f"seed {seed}: rft run failed ({proc.returncode}):\n{output}")
    summary = json.loads((work / f"seed{seed}" / tree["project"] / tree["name"] / "summary.json").read_text())
    evaluated = next(iter((summary.get("eval") or {}).values()), {})
    return {
        "first": float(summary["first_reward_mean"]),
        "last": float(summary["last_reward_mean"]),
        "eval_first": evaluated.get("first"),
        "eval_last": evaluated.get("last"),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--grpo-steps", type=int, default=None, help="override the GRPO stage's total_steps")
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="change the shipped config, e.g. --set algorithm.repeat_times=16 (repeatable)",
    )  # fmt: skip
    args = ap.parse_args()
    runs: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="quickstart-seeds-") as tmp:
        for seed in args.seeds:
            runs[seed] = run_seed(seed, Path(tmp), args.grpo_steps, args.overrides)
            r = runs[seed]
            evals = (
                f", eval {r['eval_first']:.3f} -> {r['eval_last']:.3f}" if r["eval_last"] is not None else ""
            )
            print(
                f"seed {seed}: reward {r['first']:.3f} -> {r['last']:.3f}{evals} in {r['seconds']:.0f}s",
                flush=True,
            )
    lasts = [r["last"] for r in runs.values()]
    slowest = max(r["seconds"] for r in runs.values())
    print(f"final reward: min {min(lasts):.3f}, mean {statistics.fmean(lasts):.3f}, max {max(lasts):.3f}; "
          f"slowest run {slowest:.0f}s (goals: >= {GOAL_REWARD} on every seed, < {GOAL_SECONDS:.0f}s)")  # fmt: skip
    print(json.dumps({
        "bench": "quickstart_seeds", "overrides": args.overrides, "seeds": {str(s): r for s, r in runs.items()},
        "reward_last_min": round(min(lasts), 4), "reward_last_mean": round(statistics.fmean(lasts), 4),
        "reward_first_mean": round(statistics.fmean(r["first"] for r in runs.values()), 4),
        "slowest_s": slowest, "worst_time_ratio": round(GOAL_SECONDS / slowest, 3),
        "baseline": "the SFT model (the GRPO stage's first explore step)",
        "ratio": round(min(lasts) / GOAL_REWARD, 3), "target": 1.0,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
