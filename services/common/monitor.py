"""Metric sinks behind one `Monitor` protocol: console and JSON lines always; tensorboard, wandb or
mlflow when the config asks (`monitor.monitor_type`) and the package is installed (the `monitors`
extra installs all three).

Each process logs as its own run: `<name>_trainer`, `<name>_explorer`, and with several explorers
`<name>_<explorer id>` (`<name>_explorer-0`, `<name>_explorer-1`, ...; `explorer_run_name`), so two
explorers never write the same steps into one run (whose curve would zig-zag between them). Every
backend gets every metrics line `metrics/*.jsonl` gets, with the same step; everything a backend
writes locally stays under `<job_dir>/monitor/`:
- tensorboard: event files in `monitor/<run>/` (values as float32, tensorboard's scalar type);
  `monitor_args` go to `torch.utils.tensorboard.SummaryWriter` (e.g. `flush_secs`).
- wandb: `monitor_args` go to `wandb.init` (`entity`, `mode`, `tags`, `group`, ...); its run folder is
  `monitor/wandb/`. Without a login, `mode: offline` (or WANDB_MODE=offline) writes the run there with
  no network (`wandb sync` uploads it later).
- mlflow: `monitor_args` are `tracking_uri`, `experiment_name` (default: `project`), `tags`,
  `description`. The store is `tracking_uri`, else MLFLOW_TRACKING_URI, else the SQLite file
  `monitor/mlflow.db` (`mlflow ui --backend-store-uri sqlite:///<job_dir>/monitor/mlflow.db`); the
  processes of a run open a SQLite store one at a time (a lock file beside it), since two creating its
  tables at once fail. Metric names keep only the characters mlflow accepts: `@` becomes `_at_`
  (`eval/<taskset>/accuracy/mean@4` -> `eval/<taskset>/accuracy/mean_at_4`), any other one `_`.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

from services.common.config import RFTConfig, resolve
from services.common.prometheus_steps import StepExport
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
    """Event files in `log_dir`, flushed after each step (a live `tensorboard --logdir` sees it)."""

    def __init__(self, log_dir: Path, args: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir), **dict(args))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, float(v), step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbMonitor:
    """One wandb run; a run of its own (`reinit="create_new"`), so nothing else in the process that
    uses wandb's global run is touched."""

    def __init__(self, project: str, run_name: str, job_dir: Path, args: Mapping[str, Any]):
        import wandb

        run_dir = (job_dir / "monitor").resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        kwargs = {"project": project, "name": run_name, "dir": str(run_dir), "reinit": "create_new", **args}
        try:
            self._run = wandb.init(**kwargs)
        except wandb.errors.UsageError as exc:
            raise RuntimeError(
                f"wandb cannot start the run {run_name!r}: {exc} An online run needs a login (`wandb login` "
                "or WANDB_API_KEY); an offline one needs none: monitor.monitor_args: {mode: offline} (or "
                f"WANDB_MODE=offline), and `wandb sync {run_dir}/wandb/offline-run-*` uploads it later"
            ) from exc

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        import wandb

        self._run.finish()
        # finish() can return before wandb-core has written the run's last records to its transaction log
        # (seen as an offline run file without its history); teardown waits for the core to flush and stop
        wandb.teardown()


_MLFLOW_ARGS = ("tracking_uri", "experiment_name", "tags", "description")
_MLFLOW_BAD_CHARS = re.compile(r"[^/\w.\- :]")
_MLFLOW_BATCH = 1000  # mlflow's limit of metrics per log_batch


def mlflow_metric_name(name: str) -> str:
    """The name mlflow stores a metric under: it accepts letters, digits, `_ - . / : ` and space only."""
    return _MLFLOW_BAD_CHARS.sub("_", name.replace("@", "_at_"))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class MlflowMonitor:
    """One mlflow run in the experiment `project`, through an `MlflowClient` bound to its own store:
    no process-wide tracking URI, no thread-local active run (a log from another thread lands in the
    same run)."""

    def __init__(self, project: str, run_name: str, job_dir: Path, args: Mapping[str, Any]):
        unknown = sorted(set(args) - set(_MLFLOW_ARGS))
        if unknown:
            raise ValueError(
                f"monitor.monitor_args {unknown} are not read by the mlflow monitor; it reads {list(_MLFLOW_ARGS)}"
            )
        from mlflow import MlflowClient

        local = (job_dir / "monitor").resolve()
        uri = args.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:  # the run's own SQLite store; its artifacts (none are logged) beside it
            for pkg in ("sqlalchemy", "alembic"):
                if importlib.util.find_spec(pkg) is None:
                    raise RuntimeError(
                        f"the mlflow monitor's local SQLite store needs {pkg!r}, which is not installed: "
                        f"`uv pip install --python {sys.executable} sqlalchemy alembic` (or the full "
                        "`mlflow` package), or set monitor.monitor_args.tracking_uri"
                    )
            uri, artifacts = f"sqlite:///{local / 'mlflow.db'}", (local / "mlartifacts").as_uri()
        db = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ""
        # a SQLite file: one process at a time creates its tables (two at once fail), then its run
        with _file_lock(Path(db + ".lock")) if db and db != ":memory:" else contextlib.nullcontext():
            self._client = MlflowClient(tracking_uri=uri)
            experiment_id = self._experiment(args.get("experiment_name") or project, artifacts)
            tags = dict(args.get("tags") or {})
            if args.get("description"):
                tags["mlflow.note.content"] = args["description"]
            run = self._client.create_run(experiment_id, run_name=run_name, tags=tags)
        self.tracking_uri = uri
        self.run_id = run.info.run_id

    def _experiment(self, name: str, artifact_location: str | None) -> str:
        from mlflow.exceptions import MlflowException

        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException as exc:  # another process created it first (a remote store)
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise exc from None
            return found.experiment_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_metric_name(k), float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), _MLFLOW_BATCH):
            self._client.log_batch(self.run_id, metrics=batch[i : i + _MLFLOW_BATCH])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


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
MONITORS.add(
    "tensorboard", lambda project, run, job_dir, args: TensorboardMonitor(job_dir / "monitor" / run, args)
)
MONITORS.add("wandb", lambda project, run, job_dir, args: WandbMonitor(project, run, job_dir, args))
MONITORS.add("mlflow", lambda project, run, job_dir, args: MlflowMonitor(project, run, job_dir, args))

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
    role: str = "",
    constants: Mapping[str, float] | None = None,
) -> MultiMonitor:
    """JSON lines at `job_dir/metrics/<metrics_file>` + console + the configured backend; with a
    `role` (trainer, explorer) also the process's Prometheus series (`prometheus_steps.StepExport`,
    `constants` as fixed gauges)."""
    monitors: list[Monitor] = [JsonlMonitor(job_dir / "metrics" / metrics_file)]
    if role:
        monitors.append(StepExport(role, run_name, constants))
    if console:
        monitors.append(ConsoleMonitor(run_name))
    if monitor_type not in ("none", "console"):
        factory = MONITORS.get(monitor_type)
        try:
            monitors.append(factory(project, run_name, Path(job_dir), args or {}))
        except ImportError as exc:
            pkg = _PACKAGES.get(monitor_type, monitor_type)
            raise RuntimeError(
                f"monitor.monitor_type is {monitor_type!r} but {pkg!r} is not installed ({exc}); "
                f"`uv pip install --python {sys.executable} {pkg}` (all three: the `monitors` extra) "
                "or set monitor.monitor_type: console"
            ) from exc
    return MultiMonitor(monitors)
