"""`rft plot` on metrics files written here: a PNG comes out; each explorer is its own line; stages follow
each other along the step axis in the run's order; a step written twice is drawn once; an empty or
missing folder is a clear error (exit 2 from the command)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.plot import PlotError, build_figure, plot_job, read_job


def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _axes(fig) -> dict[str, object]:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}


def _lines(ax) -> dict[str, tuple[list[float], list[float]]]:
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True)
    )


def _two_explorer_job(job: Path) -> None:
    m = job / "metrics"
    for i, base in ((0, 0.0), (1, 0.5)):
        _write(m / f"explorer_explorer-{i}.jsonl", [
            {"step": s, "rollout/reward/mean": base + s / 4, "rollout/tokens_per_s": 100.0 * (i + 1)}
            for s in (1, 2, 3)
        ] + [{"step": 3, "eval/reward/mean": 0.9}])  # fmt: skip
    _write(m / "trainer.jsonl", [
        {"step": 1, "actor/pg_loss": 1.0, "actor/entropy": 3.0, "actor/grad_norm": 2.0, "actor/ppo_kl": 0.0},
        {"step": 2, "actor/pg_loss": 0.8, "actor/entropy": 2.9, "actor/grad_norm": None},
        {"step": 2, "actor/pg_loss": 0.7, "actor/entropy": 2.8},  # written again after a restart
        {"step": 3, "actor/pg_loss": 0.5, "response_length/mean": 4.0, "perf/throughput": 900.0},
    ])  # fmt: skip


def test_two_explorers_are_two_lines_and_the_png_is_written(tmp_path):
    job = tmp_path / "job"
    _two_explorer_job(job)
    out = plot_job(job)
    assert out == job / "curves.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000

    axes = _axes(build_figure(read_job(job)))
    assert {
        "reward",
        "loss",
        "KL",
        "entropy",
        "grad norm",
        "throughput (tokens/s)",
        "response length",
    } == set(axes)
    reward = _lines(axes["reward"])
    assert set(reward) == {"explorer-0", "explorer-1"}  # one line per explorer, the eval line left out
    assert reward["explorer-0"] == ([1, 2, 3], [0.25, 0.5, 0.75])
    assert reward["explorer-1"] == ([1, 2, 3], [0.75, 1.0, 1.25])
    throughput = _lines(axes["throughput (tokens/s)"])
    assert set(throughput) == {
        "rollout/tokens_per_s (explorer-0)",
        "rollout/tokens_per_s (explorer-1)",
        "perf/throughput (trainer)",
    }
    loss = _lines(axes["loss"])
    assert loss["actor/pg_loss (trainer)"] == ([1, 2, 3], [1.0, 0.7, 0.5])  # step 2: its last line
    assert _lines(axes["grad norm"])["actor/grad_norm (trainer)"] == ([1], [2.0])  # null left out


def test_stages_follow_each_other_in_the_run_order(tmp_path):
    job = tmp_path / "run"
    _write(job / "grpo" / "metrics" / "trainer.jsonl", [{"step": s, "actor/pg_loss": -s} for s in (1, 2)])
    _write(
        job / "grpo" / "metrics" / "explorer.jsonl", [{"step": s, "rollout/reward/mean": s} for s in (1, 2)]
    )
    _write(job / "sft" / "metrics" / "trainer.jsonl", [{"step": s, "actor/pg_loss": s} for s in (1, 2, 3)])
    os.utime(job / "sft" / "metrics" / "trainer.jsonl", (1, 1))  # oldest: sft first without a summary
    stages = read_job(job)
    assert [s.name for s in stages] == ["sft", "grpo"]

    (job / "summary.json").write_text(json.dumps({"stages": [{"stage_name": "grpo"}, {"stage_name": "sft"}]}))
    assert [s.name for s in read_job(job)] == ["grpo", "sft"]  # the summary's order wins
    (job / "summary.json").write_text(json.dumps({"stages": [{"stage_name": "sft"}, {"stage_name": "grpo"}]}))

    fig = build_figure(read_job(job))
    axes = _axes(fig)
    xs, ys = _lines(axes["loss"])["actor/pg_loss (trainer)"]
    assert _same(xs, [1, 2, 3, math.nan, 4, 5]) and _same(ys, [1, 2, 3, math.nan, -1, -2])
    assert _lines(axes["reward"])["explorer"] == ([4, 5], [1, 2])  # after the 3 SFT steps
    marks = [t.get_text() for t in axes["loss"].texts]
    assert marks == ["sft", "grpo"]


def test_nothing_to_plot_is_a_clear_error(tmp_path):
    with pytest.raises(PlotError, match="no such job folder"):
        read_job(tmp_path / "missing")
    (tmp_path / "empty" / "metrics").mkdir(parents=True)
    with pytest.raises(PlotError, match="no metrics/\\*.jsonl"):
        read_job(tmp_path / "empty")
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "empty" in result.output


def test_rft_plot_command_writes_where_asked(tmp_path):
    job = tmp_path / "job"
    _two_explorer_job(job)
    out = tmp_path / "figs" / "run.png"
    result = CliRunner().invoke(app, ["plot", str(job), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"plot: {out}"
    assert out.stat().st_size > 10_000 and not (job / "curves.png").exists()
