"""Metric sinks behind one `Monitor` protocol: console and JSON lines always; tensorboard, wandb and
mlflow when the config asks and the package is installed.

Each process logs as its own run: `<name>_trainer`, `<name>_explorer`, and with several explorers
`<name>_<explorer id>` (`<name>_explorer-0`, `<name>_explorer-1`, ...; `explorer_run_name`), so two
explorers never write the same steps into one tensorboard run (whose curve would zig-zag between them).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

from services.common.config import RFTConfig, resolve
from services.common.registry import Registry


@runtime_checkable
class Monitor(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _clean(metrics: Mapping[str, float]) -> dict[str, float | None]:
    """JSON has no NaN/inf: write them as null."""
    return {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}


class JsonlMonitor:
    """One JSON object per step: {"step": N, "<metric>": value, ...}, flushed after each line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._fh.write(json.dumps({"step": step, **_clean(metrics)}, sort_keys=True) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class ConsoleMonitor:
    """A compact line per step with the chosen keys (all keys when `keys` is empty)."""

    def __init__(self, run_name: str, keys: Sequence[str] = (), stream: TextIO | None = None):
        import sys

        self.run_name = run_name
        self.keys = list(keys)
        self.stream = stream or sys.stdout

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        keys = self.keys or sorted(metrics)
        parts = [f"{k}={metrics[k]:.4g}" for k in keys if k in metrics]
        print(f"[{self.run_name}] step {step}: " + " ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        pass


class TensorboardMonitor:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbMonitor:
    def __init__(self, project: str, run_name: str, args: Mapping[str, Any]):
        import wandb

        self._run = wandb.init(project=project, name=run_name, **dict(args))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowMonitor:
    def __init__(self, project: str, run_name: str, args: Mapping[str, Any]):
        import mlflow

        self._mlflow = mlflow
        mlflow.set_experiment(project)
        mlflow.start_run(run_name=run_name, **dict(args))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


class MultiMonitor:
    def __init__(self, monitors: Sequence[Monitor]):
        self.monitors = list(monitors)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for m in self.monitors:
            m.log(metrics, step)

    def close(self) -> None:
        for m in self.monitors:
            m.close()


def explorer_run_name(config: RFTConfig, explorer_id: str) -> str:
    """The monitor run of one explorer: `<name>_explorer` for the only one (id `explorer.name`), else
    `<name>_<explorer id>`; the tensorboard folder is `<job_dir>/monitor/<run>`."""
    if explorer_id == config.explorer.name:
        return resolve(config).explorer_run_name
    return f"{config.name}_{explorer_id}"


MONITORS: Registry[Any] = Registry("monitor")
MONITORS.add("tensorboard", lambda project, run, job_dir, args: TensorboardMonitor(job_dir / "monitor" / run))
MONITORS.add("wandb", lambda project, run, job_dir, args: WandbMonitor(project, run, args))
MONITORS.add("mlflow", lambda project, run, job_dir, args: MlflowMonitor(project, run, args))

_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def build_monitor(
    monitor_type: str,
    *,
    project: str,
    run_name: str,
    job_dir: Path,
    metrics_file: str,
    args: Mapping[str, Any] | None = None,
    console: bool = True,
) -> MultiMonitor:
    """JSON lines at `job_dir/metrics/<metrics_file>` + console + the configured backend."""
    monitors: list[Monitor] = [JsonlMonitor(job_dir / "metrics" / metrics_file)]
    if console:
        monitors.append(ConsoleMonitor(run_name))
    if monitor_type not in ("none", "console"):
        factory = MONITORS.get(monitor_type)
        try:
            monitors.append(factory(project, run_name, job_dir, args or {}))
        except ImportError as exc:
            pkg = _PACKAGES.get(monitor_type, monitor_type)
            raise RuntimeError(
                f"monitor.monitor_type is {monitor_type!r} but {pkg!r} is not installed ({exc}); "
                f"`uv pip install --python {sys.executable} {pkg}` or set monitor.monitor_type: console"
            ) from exc
    return MultiMonitor(monitors)
