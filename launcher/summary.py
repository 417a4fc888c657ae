"""`summary.json`: what a run did, from what its services left in the job folder.

Per stage (written to the stage's job folder) and for the whole run (the run's job folder):

    status            finished | failed | interrupted
    steps             trained steps (the trainer's last committed step; summed over stages at the top)
    model_version     the model version the run ended with (last stage)
    first_reward_mean rollout/reward/mean of the first explorer step
    last_reward_mean  mean of rollout/reward/mean over the last 5 explorer steps
                      (at the top: both from the last stage that explored, e.g. the RL stage after SFT)
    eval              per eval taskset, its mean reward at the first and at the last evaluation and
                      their explorer steps: {"<taskset>": {"first": 0.57, "first_step": 0, "last": 0.93,
                      "last_step": 220}} (every task, `repeat_times` samples each: a steadier start
                      than the first explore step's batch); {} when nothing was evaluated
    wall_time_s       seconds the stage ran, added up over every `rft run` that continued it (the
                      metrics files, and so the counts below, keep the lines of the runs before);
                      at the top the sum over the stages, so a finished run started again keeps it
    samples_per_s     experiences explored (or trained, when nothing explored) per second of wall time
    checkpoint        the last HF export (global_step_N/huggingface), or the last checkpoint folder
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.progress import read_jsonl

LAST_N = 5


def _explorer_records(job_dir: Path) -> list[dict[str, Any]]:
    """Explore-step records of every explorer, ordered by step (eval/bench lines left out)."""
    recs: list[dict[str, Any]] = []
    for path in sorted((job_dir / "metrics").glob("explorer*.jsonl")):
        recs += [r for r in read_jsonl(path) if r.get("rollout/reward/mean") is not None]
    recs.sort(key=lambda r: int(r.get("step", 0)))  # stable: a step repeated after a resume stays in order
    return recs


def eval_summary(job_dir: Path) -> dict[str, dict[str, float]]:
    """Per eval taskset: the mean reward at its first and last evaluation (`eval/<taskset>/reward/mean@k`
    in the explorers' metrics), with their steps."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted((job_dir / "metrics").glob("explorer*.jsonl")):
        for r in read_jsonl(path):
            for key, value in r.items():
                parts = key.split("/")
                if (
                    len(parts) != 4
                    or parts[0] != "eval"
                    or parts[2] != "reward"
                    or not parts[3].startswith("mean@")
                ):
                    continue
                step = int(r.get("step", 0))
                seen = out.setdefault(parts[1], {"first": float(value), "first_step": step})
                if step < seen["first_step"]:
                    seen.update(first=float(value), first_step=step)
                if step >= seen.get("last_step", -1):
                    seen.update(last=float(value), last_step=step)
    return out


def last_checkpoint(job_dir: Path) -> tuple[int, Path | None]:
    """(step, folder) of the newest complete checkpoint (the trainer's marker file)."""
    marker = job_dir / "latest_checkpointed_iteration.txt"
    try:
        step = int(marker.read_text().strip())
    except (OSError, ValueError):
        return 0, None
    folder = job_dir / f"global_step_{step}"
    return step, (folder if folder.is_dir() else None)


def last_hf_export(job_dir: Path) -> Path | None:
    """The newest `global_step_N/huggingface` folder holding a config.json."""
    found = []
    for d in job_dir.glob("global_step_*/huggingface"):
        try:
            step = int(d.parent.name.rsplit("_", 1)[1])
        except ValueError:
            continue
        if (d / "config.json").is_file():
            found.append((step, d))
    return max(found)[1] if found else None


def stage_summary(job_dir: Path, status: str, wall_time_s: float, train_batch_size: int) -> dict[str, Any]:
    explore = _explorer_records(job_dir)
    trainer = read_jsonl(job_dir / "metrics" / "trainer.jsonl")
    ckpt_step, ckpt = last_checkpoint(job_dir)
    steps = max([ckpt_step] + [int(r.get("step", 0)) for r in trainer])
    hf = last_hf_export(job_dir)
    rewards = [float(r["rollout/reward/mean"]) for r in explore]
    versions = [r.get("rollout/model_version") for r in explore if r.get("rollout/model_version") is not None]
    explored = sum(int(r.get("rollout/experience_count", 0) or 0) for r in explore)
    if not explored:
        explored = steps * train_batch_size
    return {
        "status": status,
        "steps": steps,
        "model_version": max([steps] + [int(v) for v in versions]),
        "first_reward_mean": rewards[0] if rewards else None,
        "last_reward_mean": sum(rewards[-LAST_N:]) / len(rewards[-LAST_N:]) if rewards else None,
        "explore_steps": max([0] + [int(r.get("step", 0)) for r in explore]),
        "eval": eval_summary(job_dir),
        "wall_time_s": round(wall_time_s, 2),
        "samples_per_s": round(explored / wall_time_s, 3) if wall_time_s > 0 else None,
        "checkpoint": str(hf or ckpt or "") or None,
        "job_dir": str(job_dir),
    }


def earlier_wall_time(previous: dict[str, Any] | None) -> float:
    """Seconds a stage already ran in the `rft run`s before this one (0 without an earlier summary)."""
    try:
        return max(0.0, float((previous or {}).get("wall_time_s") or 0.0))
    except (TypeError, ValueError):
        return 0.0


def run_summary(stages: Sequence[tuple[str, dict[str, Any]]], status: str) -> dict[str, Any]:
    """The whole run: sums and firsts/lasts over the stages' summaries, plus each stage's.

    The wall time is the stages' sum, not the time of this `rft run`: a stage that finished in an
    earlier run is taken over with its own time, so a finished run started again keeps its numbers."""
    if len(stages) == 1 and not stages[0][0]:
        return {**stages[0][1], "status": status}
    summaries = [s for _, s in stages]
    explored = [s for s in summaries if s.get("first_reward_mean") is not None]
    last = summaries[-1] if summaries else {}
    wall_time_s = sum(float(s.get("wall_time_s") or 0.0) for s in summaries)
    total_rate = sum((s.get("samples_per_s") or 0) * (s.get("wall_time_s") or 0) for s in summaries)
    return {
        "status": status,
        "steps": sum(int(s.get("steps", 0)) for s in summaries),
        "model_version": last.get("model_version", 0),
        "first_reward_mean": explored[-1]["first_reward_mean"] if explored else None,
        "last_reward_mean": explored[-1]["last_reward_mean"] if explored else None,
        "eval": next((s["eval"] for s in reversed(summaries) if s.get("eval")), {}),
        "wall_time_s": round(wall_time_s, 2),
        "samples_per_s": round(total_rate / wall_time_s, 3) if wall_time_s > 0 else None,
        "checkpoint": next((s["checkpoint"] for s in reversed(summaries) if s.get("checkpoint")), None),
        "stages": [{"stage_name": name, **s} for name, s in stages],
    }


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, path)


def read_summary(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
