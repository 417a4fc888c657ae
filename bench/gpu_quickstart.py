"""The quickstart on one GPU: `rft run` of examples/quickstart.yaml with the trainer and the explorer on GPU 0.

    python bench/gpu_quickstart.py [--config examples/quickstart_one_gpu.yaml] [--seed 1] [--grpo-steps N]
                                   [--set KEY=VALUE ...]

The run is `bench/quickstart_seeds.py`'s (the shipped quickstart, data order `--seed`), given the one-GPU
example's placement (`cluster.gpu_per_node: 1`: both processes share cuda:0, weights over the same-device
path); `--set` changes it further (e.g. `--set synchronizer.sync_style=fully_async --set
explorer.inflight_weight_update=true`: the run of scripts/gpu_probe.sh, whose figures then count the
weight versions that landed mid-generation). While it runs, the GPU's used memory is sampled with `nvidia-smi` every 0.2 s (all processes
together: trainer + explorer). Printed: the GRPO stage's reward curve (every 20th explore step), its
first and last reward (the baseline is the SFT model: the GRPO stage's first explore step, measured in the
same run), rollout tokens/s (response tokens the explorer generated per second of its explore steps), the
trainer's tokens/s, the GPU memory peak and the wall time. The last line is one JSON object; "ratio" is
the final reward / 0.9 (target 1.0: the CPU quickstart's goal, reached on a GPU too).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from quickstart_seeds import GOAL_REWARD, run_seed  # noqa: E402

from launcher.progress import read_jsonl  # noqa: E402


class GpuMemorySampler:
    """Peak of `nvidia-smi`'s used memory (MiB, GPU 0) while the context is open; None without nvidia-smi."""

    def __init__(self, interval_s: float = 0.2):
        self.interval_s = interval_s
        self.peak_mib: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int | None:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout  # fmt: skip
            return int(out.strip().splitlines()[0])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            used = self._sample()
            if used is not None:
                self.peak_mib = max(self.peak_mib or 0, used)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GpuMemorySampler:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def overrides_of(config: Path) -> list[str]:
    """The one-GPU example's differences from the quickstart, as `--set` overrides: its `cluster`,
    `explorer.rollout_model` and `synchronizer` keys (the rest of the run is the shipped quickstart's)."""
    tree = yaml.safe_load(config.read_text())
    out = []

    def walk(prefix: str, node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out.append(f"{prefix}={json.dumps(node)}")

    for section in ("cluster", "synchronizer", "trainer"):
        walk(section, tree.get(section, {}))
    walk("explorer.rollout_model", tree.get("explorer", {}).get("rollout_model", {}))
    return out


def stage_figures(job_dir: Path) -> dict[str, object]:
    """Reward curve, rollout and trainer tokens/s of one stage's metrics files."""
    explore = []
    for path in sorted((job_dir / "metrics").glob("explorer*.jsonl")):
        explore += [r for r in read_jsonl(path) if r.get("rollout/reward/mean") is not None]
    explore.sort(key=lambda r: int(r.get("step", 0)))
    trainer = read_jsonl(job_dir / "metrics" / "trainer.jsonl")
    curve = {int(r["step"]): round(float(r["rollout/reward/mean"]), 3) for r in explore}
    rates = [float(r["perf/throughput"]) for r in trainer if r.get("perf/throughput")]
    rollout = [float(r["rollout/tokens_per_s"]) for r in explore if r.get("rollout/tokens_per_s")]
    inflight = [float(r["rollout/inflight_updates"]) for r in explore if "rollout/inflight_updates" in r]
    mixed = [
        float(r["rollout/inflight_mixed_fraction"]) for r in explore if "rollout/inflight_mixed_fraction" in r
    ]
    return {
        "inflight_updates": sum(inflight) if inflight else None,
        "inflight_mixed_fraction_max": max(mixed) if mixed else None,
        "reward_curve": curve,
        "trainer_tokens_per_s": round(statistics.median(rates), 1) if rates else None,
        "rollout_tokens_per_s": round(statistics.median(rollout), 1) if rollout else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart_one_gpu.yaml")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--grpo-steps", type=int, default=None)
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="after the one-GPU placement, e.g. --set synchronizer.sync_style=fully_async (repeatable)",
    )  # fmt: skip
    args = ap.parse_args()
    sets = overrides_of(args.config) + args.overrides
    print("one-GPU overrides of the quickstart:", " ".join(sets), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-quickstart-") as tmp, GpuMemorySampler() as mem:
        run = run_seed(args.seed, Path(tmp), args.grpo_steps, sets, stream=True)
        job = Path(tmp) / f"seed{args.seed}" / "quickstart" / "arithmetic" / "grpo"
        figures = stage_figures(job)
    curve = figures["reward_curve"]
    assert isinstance(curve, dict)
    shown = {s: r for s, r in curve.items() if s % 20 == 0 or s == max(curve)}
    print("GRPO reward by explore step:", " ".join(f"{s}:{r}" for s, r in shown.items()))
    print(
        f"reward {run['first']:.3f} -> {run['last']:.3f} in {run['seconds']:.0f}s; rollout "
        f"{figures['rollout_tokens_per_s']} tokens/s, trainer {figures['trainer_tokens_per_s']} tokens/s; "
        f"GPU memory peak {mem.peak_mib} MiB"
    )
    print(json.dumps({
        "bench": "gpu_quickstart", "overrides": sets, "seed": args.seed,
        "reward_first": run["first"], "reward_last": run["last"], "seconds": run["seconds"],
        "reward_curve": {str(k): v for k, v in shown.items()},
        "rollout_tokens_per_s": figures["rollout_tokens_per_s"],
        "trainer_tokens_per_s": figures["trainer_tokens_per_s"], "gpu_memory_peak_mib": mem.peak_mib,
        "inflight_updates": figures["inflight_updates"],
        "inflight_mixed_fraction_max": figures["inflight_mixed_fraction_max"],
        "baseline": "the SFT model (the GRPO stage's first explore step)",
        "ratio": round(run["last"] / GOAL_REWARD, 3), "target": 1.0,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
