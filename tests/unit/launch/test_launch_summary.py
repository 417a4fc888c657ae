"""summary.json when a run is started again: a finished quickstart run again (every stage finished in an
earlier run, so no process starts) keeps its wall time and samples/s, and the final lines name the
summary and the curves; the wall time of a run is the sum over its stages."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from launcher import _main
from launcher.runner import StageOptions, stage_total_steps
from launcher.stages import run_stages
from launcher.summary import earlier_wall_time, read_summary, run_summary, write_summary
from services.common.config import load_config

ROOT = Path(__file__).resolve().parents[3]


def _jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _stage(
    stage_dir: Path,
    steps: int,
    wall_time_s: float,
    samples_per_s: float,
    rewards: list[float],
    total_steps: int | None = None,
) -> dict:
    _jsonl(
        stage_dir / "metrics" / "trainer.jsonl",
        [{"step": s, "actor/pg_loss": 1 / s} for s in range(1, steps + 1)],
    )
    if rewards:
        _jsonl(stage_dir / "metrics" / "explorer.jsonl",
               [{"step": i + 1, "rollout/reward/mean": r} for i, r in enumerate(rewards)])  # fmt: skip
    export = stage_dir / f"global_step_{steps}" / "huggingface"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    summary = {
        "status": "finished",
        "steps": steps,
        "model_version": steps,
        "first_reward_mean": rewards[0] if rewards else None,
        "last_reward_mean": sum(rewards[-5:]) / len(rewards[-5:]) if rewards else None,
        "explore_steps": len(rewards),
        "wall_time_s": wall_time_s,
        "samples_per_s": samples_per_s,
        "checkpoint": str(export),
        "job_dir": str(stage_dir),
        "total_steps": total_steps or steps,
    }
    write_summary(stage_dir / "summary.json", summary)
    return summary


def test_a_finished_run_started_again_keeps_its_summary(tmp_path, capsys):
    config = load_config(ROOT / "examples" / "quickstart.yaml", overrides=[f"checkpoint_root_dir={tmp_path}"])
    stages = run_stages(config)
    assert [s.name for s in stages] == ["sft", "grpo"]
    sft_steps, grpo_steps = stage_total_steps(stages[0]), stage_total_steps(stages[1])
    sft = _stage(stages[0].job_dir, sft_steps, 30.0, 25.0, [])
    # the data ended at step 12 of the GRPO stage's steps: finished all the same
    grpo = _stage(stages[1].job_dir, 12, 120.0, 90.0, [0.2, 0.4, 0.6, 0.8, 0.8, 0.8], total_steps=grpo_steps)
    top_file = stages[1].job_dir.parent / "summary.json"
    write_summary(top_file, run_summary([("sft", sft), ("grpo", grpo)], "finished"))
    first = read_summary(top_file)
    assert first["wall_time_s"] == 150.0 and first["samples_per_s"] == pytest.approx(
        (25 * 30 + 90 * 120) / 150
    )

    assert asyncio.run(_main(config, stages, StageOptions())) == 0
    out = capsys.readouterr().out
    assert out.count("finished in an earlier run") == 2
    assert read_summary(top_file) == first  # not wall_time_s 0.0 and an absurd samples_per_s
    lines = out.splitlines()
    assert lines[-4] == f"rft run: finished: {sft_steps + 12} steps, reward 0.200 -> 0.680, 150s"
    assert lines[-3:] == [f"checkpoint: {grpo['checkpoint']}", f"summary: {top_file}",
                          f"plot: {top_file.parent / 'curves.png'}"]  # fmt: skip
    assert (top_file.parent / "curves.png").stat().st_size > 10_000


def test_the_time_of_earlier_runs_is_carried():
    assert earlier_wall_time(None) == 0.0
    assert earlier_wall_time({"status": "interrupted", "wall_time_s": 41.5}) == 41.5
    assert earlier_wall_time({"wall_time_s": None}) == 0.0 and earlier_wall_time({"wall_time_s": "x"}) == 0.0


def _single_stage(tmp_path: Path, total_steps: int):
    config = load_config(
        ROOT / "examples" / "quickstart.yaml",
        overrides=[f"checkpoint_root_dir={tmp_path}", "stages=[]", f"buffer.total_steps={total_steps}"],
    )
    stages = run_stages(config)
    assert len(stages) == 1 and not stages[0].name
    return config, stages


def test_a_finished_single_stage_run_started_again_starts_nothing(tmp_path, capsys):
    config, stages = _single_stage(tmp_path, total_steps=6)
    before = _stage(stages[0].job_dir, 6, 60.0, 12.0, [0.1, 0.5])
    assert asyncio.run(_main(config, stages, StageOptions())) == 0
    out = capsys.readouterr().out
    assert "finished in an earlier run" in out and "started " not in out
    assert read_summary(stages[0].job_dir / "summary.json") == {**before, "status": "finished"}


def test_a_finished_run_asked_for_more_steps_is_not_taken_as_finished():
    from launcher import _finished_before

    done = {"status": "finished", "steps": 6, "explore_steps": 6}
    assert _finished_before(done, 6) and _finished_before(done, None)
    assert not _finished_before(done, 12)  # a larger total_steps trains on
    ended_early = {**done, "total_steps": 20}  # the data ended first
    assert _finished_before(ended_early, 20) and not _finished_before(ended_early, 30)
    assert not _finished_before({**done, "status": "interrupted"}, 6)
    assert not _finished_before(None, 6)
    assert _finished_before({"status": "finished", "steps": 0, "explore_steps": 4}, 4)  # explore mode


def test_the_summary_keeps_each_eval_tasksets_first_and_last_evaluation(tmp_path):
    from launcher.summary import stage_summary

    _jsonl(tmp_path / "metrics" / "explorer.jsonl", [
        {"step": 0, "eval/arithmetic/reward/mean@16": 0.57, "eval/arithmetic/pass@16": 0.9, "time/eval": 1.0},
        {"step": 1, "rollout/reward/mean": 0.5},
        {"step": 2, "rollout/reward/mean": 0.7, "eval/arithmetic/reward/std@16": 0.1},
        {"step": 2, "eval/arithmetic/reward/mean@16": 0.93, "eval/other/reward/mean@4": 0.25},
    ])  # fmt: skip
    summary = stage_summary(tmp_path, "finished", 10.0, 8)
    assert summary["eval"] == {
        "arithmetic": {"first": 0.57, "first_step": 0, "last": 0.93, "last_step": 2},
        "other": {"first": 0.25, "first_step": 2, "last": 0.25, "last_step": 2},
    }
    assert summary["first_reward_mean"] == 0.5  # explore steps only
    top = run_summary(
        [("sft", {**summary, "eval": {}, "first_reward_mean": None}), ("grpo", summary)], "finished"
    )
    assert top["eval"] == summary["eval"]
    assert stage_summary(tmp_path / "none", "finished", 1.0, 8)["eval"] == {}
