"""`rft plot`: the curves of a run as one PNG, from the metrics files its services left
(`metrics/trainer.jsonl`, `metrics/explorer*.jsonl`; one JSON object per step).

Panels, each drawn when its metrics are there: reward, response length, losses (actor/pg_loss,
critic/vf_loss, actor/kl_loss), KL, entropy, grad norm and throughput (tokens/s), against the step.
Each explorer is its own line (`explorer.jsonl` is the only explorer's, `explorer_<id>.jsonl` that of
explorer `<id>`, e.g. `explorer-0`, `explorer-1` with `rft run --explorers 2`), so explorers sharing a
step axis never zig-zag into one curve.

A run with stages (`<job>/<stage_name>/metrics/...`) is one figure: the stages follow each other along
the step axis (each shifted by the steps of the stages before it), a dashed line and the stage's name
mark where each begins. Their order is the one in the run's summary.json, else the order their metrics
files were last written. A step written twice (a trainer restarted from its checkpoint writes the steps
after it again) is drawn once, with its last value.

Matplotlib runs without pyplot or a display (a bare `Figure` renders through Agg).
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.progress import read_jsonl

# (title, [(source kind, metric key)]): "explorer" lines are one per explorer, "trainer" one.
PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("reward", [("explorer", "rollout/reward/mean")]),
    ("response length", [("explorer", "rollout/response_length/mean"), ("trainer", "response_length/mean")]),
    ("loss", [("trainer", "actor/pg_loss"), ("trainer", "critic/vf_loss"), ("trainer", "actor/kl_loss")]),
    ("KL", [("trainer", "actor/ppo_kl"), ("trainer", "actor/reward_kl_penalty")]),
    ("entropy", [("trainer", "actor/entropy")]),
    ("grad norm", [("trainer", "actor/grad_norm"), ("trainer", "critic/grad_norm")]),
    ("throughput (tokens/s)", [("explorer", "rollout/tokens_per_s"), ("trainer", "perf/throughput")]),
]
DEFAULT_NAME = "curves.png"


class PlotError(ValueError):
    """Nothing to plot where asked; the message says where it looked."""


@dataclass
class StageMetrics:
    name: str  # "" for a run without stages
    sources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # "trainer" | explorer id

    @property
    def last_step(self) -> int:
        return max((int(r.get("step", 0)) for recs in self.sources.values() for r in recs), default=0)


def _source_name(path: Path) -> str:
    """`trainer.jsonl` -> trainer; `explorer.jsonl` -> explorer; `explorer_<id>.jsonl` -> <id>."""
    stem = path.stem
    return stem.split("_", 1)[1] if stem.startswith("explorer_") else stem


def read_stage(metrics_dir: Path, name: str) -> StageMetrics:
    stage = StageMetrics(name)
    for path in sorted(metrics_dir.glob("*.jsonl")):
        if path.stem == "trainer" or path.stem.startswith("explorer"):
            stage.sources[_source_name(path)] = read_jsonl(path)
    return stage


def _stage_dirs(job_dir: Path) -> list[tuple[str, Path]]:
    if (job_dir / "metrics").is_dir():
        return [("", job_dir / "metrics")]
    found = {d.name: d / "metrics" for d in job_dir.iterdir() if (d / "metrics").is_dir()}
    order: list[str] = []
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        order = [s["stage_name"] for s in json.loads((job_dir / "summary.json").read_text())["stages"]]

    def written(name: str) -> float:
        return max((p.stat().st_mtime for p in found[name].glob("*.jsonl")), default=0.0)

    rest = sorted((n for n in found if n not in order), key=written)
    return [(n, found[n]) for n in [*order, *rest] if n in found]


def read_job(job_dir: Path) -> list[StageMetrics]:
    """The metrics of every stage of JOB_DIR (a run's job folder or one stage's), in run order."""
    if not job_dir.is_dir():
        raise PlotError(f"{job_dir}: no such job folder; pass the folder `rft run` wrote (its job_dir)")
    stages = [read_stage(path, name) for name, path in _stage_dirs(job_dir)]
    stages = [s for s in stages if any(s.sources.values())]
    if not stages:
        raise PlotError(
            f"{job_dir}: no metrics/*.jsonl here nor in a stage folder (<stage>/metrics/); pass a job "
            "folder `rft run` wrote, e.g. checkpoints/<project>/<name>"
        )
    return stages


def _series(records: list[dict[str, Any]], key: str) -> dict[int, float]:
    """step -> value, the last line of a step winning; null (NaN/inf) values left out."""
    out: dict[int, float] = {}
    for rec in records:
        value = rec.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[int(rec.get("step", 0))] = float(value)
    return out


def build_figure(stages: list[StageMetrics], title: str = ""):
    """A matplotlib Figure with one axes per panel that has data; each line labelled by its source."""
    from matplotlib.figure import Figure

    placed: list[tuple[StageMetrics, int]] = []  # each stage with the steps of the stages before it
    for stage in stages:
        placed.append((stage, sum(s.last_step for s, _ in placed)))
    # (panel title) -> {label: (xs, ys)}; stages of one line joined with a NaN gap between them
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for panel, specs in PANELS:
        keys = {key for _, key in specs}
        for stage, offset in placed:
            for source, records in stage.sources.items():
                kind = "trainer" if source == "trainer" else "explorer"
                for spec_kind, key in specs:
                    if spec_kind != kind:
                        continue
                    points = _series(records, key)
                    if not points:
                        continue
                    label = source if len(keys) == 1 else f"{key} ({source})"
                    xs, ys = panels.setdefault(panel, {}).setdefault(label, ([], []))
                    if xs:
                        xs.append(math.nan)
                        ys.append(math.nan)
                    for step in sorted(points):
                        xs.append(step + offset)
                        ys.append(points[step])
    if not panels:
        raise PlotError("the metrics files hold none of the plotted metrics: " + ", ".join(
            sorted({key for _, specs in PANELS for _, key in specs})))  # fmt: skip
    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6.4 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    ordered = [t for t, _ in PANELS if t in panels]
    for ax, name in zip(axes, ordered, strict=False):  # more axes than panels: the rest hidden
        for label, (xs, ys) in panels[name].items():
            ax.plot(xs, ys, label=label, linewidth=1.2, marker="." if len(xs) < 40 else None)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        for stage, offset in placed:
            if stage.name and len(stages) > 1:
                ax.axvline(offset, color="grey", linestyle="--", linewidth=0.8)
                ax.annotate(stage.name, (offset, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(3, -10), textcoords="offset points", fontsize="small", color="grey")  # fmt: skip
    for ax in axes[len(ordered) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def plot_job(job_dir: Path, out: Path | None = None) -> Path:
    """Write the curves of JOB_DIR to OUT (default JOB_DIR/curves.png); returns the path."""
    job_dir = Path(job_dir)
    stages = read_job(job_dir)
    out = Path(out) if out is not None else job_dir / DEFAULT_NAME
    fig = build_figure(stages, title=str(job_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=100)
    tmp.replace(out)
    return out
