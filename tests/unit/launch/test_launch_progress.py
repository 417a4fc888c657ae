"""The progress line after a resume or a restart: the step is the last line's (a restarted trainer
rewinds to its checkpoint and writes those steps again), and the ETA comes from the steps written
since the current process started, never from lines an earlier process left (no `ETA 0s` at once)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from launcher.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _append(path: Path, *steps: int) -> None:
    with path.open("a") as fh:
        for step in steps:
            fh.write(json.dumps({"step": step, "actor/pg_loss": 0.5}) + "\n")


def _progress(tmp_path: Path, clock: Clock) -> tuple[Progress, Path]:
    (tmp_path / "metrics").mkdir()
    trainer = tmp_path / "metrics" / "trainer.jsonl"
    trainer.touch()
    return Progress(tmp_path, "grpo", 170, stream=io.StringIO(), live=False, clock=clock), trainer


def test_old_lines_give_the_step_but_no_rate(tmp_path):
    clock = Clock()
    trainer = tmp_path / "metrics" / "trainer.jsonl"
    trainer.parent.mkdir()
    _append(trainer, *range(1, 71))  # an earlier run's lines
    progress = Progress(tmp_path, "grpo", 170, stream=io.StringIO(), live=False, clock=clock)
    clock.now = 100.0
    progress.poll()
    assert progress.trainer_step == 70 and progress.eta_s is None
    assert "step 70/170" in progress.line() and "ETA" not in progress.line()

    clock.now = 110.0
    _append(trainer, 71)
    progress.poll()
    clock.now = 120.0
    _append(trainer, 72)
    progress.poll()
    assert progress.eta_s == (170 - 72) * (120.0 - 100.0) / 2  # 10 s a step since this process started


def test_a_rewound_trainer_shows_the_last_step_and_a_fresh_rate(tmp_path):
    clock = Clock()
    progress, trainer = _progress(tmp_path, clock)
    for step in range(1, 76):  # one step a second up to 75
        clock.now = float(step)
        _append(trainer, step)
        progress.poll()
    assert progress.trainer_step == 75 and progress.eta_s == (170 - 75) * 1.0

    clock.now = 200.0  # the trainer died; its successor resumes from the checkpoint of step 70
    _append(trainer, 71)
    progress.poll()
    assert progress.trainer_step == 71 and progress.eta_s is None  # not the max (75), not the old rate
    clock.now = 205.0
    _append(trainer, 72)
    progress.poll()
    assert progress.trainer_step == 72 and progress.eta_s == (170 - 72) * 5.0


def test_a_restart_drops_the_rate_until_new_steps_come(tmp_path):
    clock = Clock()
    progress, trainer = _progress(tmp_path, clock)
    for step in (1, 2, 3):
        clock.now = float(step)
        _append(trainer, step)
        progress.poll()
    assert progress.eta_s is not None
    clock.now = 50.0
    progress.restarted()  # e.g. the buffer was restarted: the time it took is not the trainer's pace
    assert progress.eta_s is None and progress.trainer_step == 3
    clock.now = 60.0
    _append(trainer, 4)
    progress.poll()
    clock.now = 62.0
    _append(trainer, 5)
    progress.poll()
    assert progress.eta_s == (170 - 5) * 2.0


def test_explorer_step_follows_each_file_latest_line(tmp_path):
    clock = Clock()
    progress, _ = _progress(tmp_path, clock)
    explorer = tmp_path / "metrics" / "explorer.jsonl"
    with explorer.open("a") as fh:
        for step in (9, 10, 8):  # the explorer rewound to the trainer's step
            fh.write(json.dumps({"step": step, "rollout/reward/mean": step / 10}) + "\n")
    progress.poll()
    assert progress.explorer_step == 8 and progress.reward == 0.8
