"""Monitors: JSON lines per step (NaN as null), console line, clear errors for a missing backend, and each
backend (tensorboard, wandb offline, mlflow on its local SQLite store) read back with its own library:
the same steps and values as the JSON lines."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from services.common.monitor import ConsoleMonitor, build_monitor, mlflow_metric_name
from tests.support.monitor_runs import (
    jsonl_series,
    last_per_step,
    mlflow_series,
    tensorboard_series,
    wandb_run,
    wandb_run_files,
)
from tests.support.rft_run import ROOT, env

LINES = [  # what a run logs: '@' in eval names, a NaN, two lines at one step (explore, then eval)
    ({"actor/pg_loss": 0.5, "actor/grad_norm": float("nan"), "rollout/reward/mean": 0.1}, 1),
    ({"actor/pg_loss": 0.25, "actor/grad_norm": 1.5, "rollout/reward/mean": 0.3}, 2),
    ({"eval/arith/accuracy/mean@4": 0.75, "eval/arith/pass@2": 1.0}, 2),
    ({"actor/pg_loss": -1e-7, "actor/grad_norm": 3.0, "rollout/reward/mean": 1 / 3}, 3),
]


def test_jsonl_and_console(tmp_path):
    mon = build_monitor(
        "none",
        project="p",
        run_name="r_trainer",
        job_dir=tmp_path,
        metrics_file="trainer.jsonl",
        console=False,
    )
    mon.log({"actor/pg_loss": 0.5, "actor/grad_norm": float("nan")}, step=1)
    mon.log({"actor/pg_loss": 0.25}, step=2)
    mon.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics" / "trainer.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 1, "actor/pg_loss": 0.5, "actor/grad_norm": None},
        {"step": 2, "actor/pg_loss": 0.25},
    ]
    out = io.StringIO()
    ConsoleMonitor("r", keys=["a"], stream=out).log({"a": 1.23456, "b": 2}, step=3)
    assert out.getvalue() == "[r] step 3: a=1.235\n"


@pytest.mark.parametrize("backend", ["tensorboard", "wandb", "mlflow"])
def test_missing_backend_package_is_a_clear_error(tmp_path, monkeypatch, backend):
    monkeypatch.setitem(sys.modules, "mlflow" if backend == "mlflow" else backend, None)  # import fails
    if backend == "tensorboard":
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(RuntimeError, match=f"'{backend}' is not installed.*the `monitors` extra"):
        build_monitor(backend, project="p", run_name="r", job_dir=tmp_path, metrics_file="x.jsonl")


def test_mlflow_metric_names_keep_only_what_mlflow_accepts():
    assert mlflow_metric_name("eval/arith/accuracy/mean@4") == "eval/arith/accuracy/mean_at_4"
    assert mlflow_metric_name("timing_s/update actor:1.x") == "timing_s/update actor:1.x"
    assert mlflow_metric_name("perf/mfu(%)") == "perf/mfu___"


def _log(backend: str, tmp_path, run_name: str = "arith_trainer", args=None):
    mon = build_monitor(
        backend,
        project="p",
        run_name=run_name,
        job_dir=tmp_path,
        metrics_file="trainer.jsonl",
        args=args,
        console=False,
    )
    for metrics, step in LINES:
        mon.log(metrics, step)
    mon.close()
    return mon.monitors[-1], jsonl_series(tmp_path / "metrics" / "trainer.jsonl")


def _f32(series):
    return {k: [(s, None if v is None else float(np.float32(v))) for s, v in pts] for k, pts in series.items()}


def test_tensorboard_reads_back_the_jsonl_lines(tmp_path):
    _, expected = _log("tensorboard", tmp_path)
    assert tensorboard_series(tmp_path / "monitor" / "arith_trainer") == _f32(expected)


def test_wandb_offline_run_reads_back_the_jsonl_lines(tmp_path):
    mon, expected = _log("wandb", tmp_path, args={"mode": "offline"})
    files = wandb_run_files(tmp_path / "monitor")
    assert list(files) == [mon._run.id]  # the run this monitor started, and no other
    name, series = wandb_run(files[mon._run.id])
    assert name in ("arith_trainer", None)  # None: wandb-core left out its run record (see `wandb_run`)
    assert series == last_per_step(expected)  # wandb keeps one row per step


def test_mlflow_local_store_reads_back_the_jsonl_lines(tmp_path):
    mon, expected = _log("mlflow", tmp_path, args={"tags": {"stage": "grpo"}})
    assert mon.tracking_uri == f"sqlite:///{tmp_path.resolve() / 'monitor' / 'mlflow.db'}"
    got = mlflow_series(mon.tracking_uri, "p", "arith_trainer")
    assert got == {mlflow_metric_name(k): v for k, v in expected.items()}
    assert math.isnan(LINES[0][0]["actor/grad_norm"]) and got["actor/grad_norm"][0] == (1, None)


@pytest.mark.slow
def test_processes_open_one_mlflow_store_at_once(tmp_path):
    """Three monitors start on a fresh SQLite store together (a run's trainer and explorers do): without
    the lock the second to create its tables fails (`duplicate column name`)."""
    store = tmp_path / "monitor" / "mlflow.db"
    script = (
        "import sys; from pathlib import Path; from services.common.monitor import build_monitor\n"
        "m = build_monitor('mlflow', project='p', run_name=sys.argv[1], job_dir=Path(sys.argv[2]),"
        " metrics_file=sys.argv[1] + '.jsonl', console=False)\n"
        "m.log({'x': 1.0}, 1); m.close()\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, f"r{i}", str(tmp_path)], cwd=ROOT, env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        for i in range(3)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-1500:] for o in outs)
    for i in range(3):
        assert mlflow_series(f"sqlite:///{store}", "p", f"r{i}") == {"x": [(1, 1.0)]}


def test_mlflow_refuses_args_it_does_not_read(tmp_path):
    with pytest.raises(ValueError, match=r"\['uri'\] are not read by the mlflow monitor"):
        build_monitor(
            "mlflow", project="p", run_name="r", job_dir=tmp_path, metrics_file="x.jsonl", args={"uri": "x"}
        )


def test_wandb_without_login_says_how_to_run_offline(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))  # no stored login
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(RuntimeError, match=r"wandb cannot start the run 'r'.*mode: offline"):
        build_monitor("wandb", project="p", run_name="r", job_dir=tmp_path, metrics_file="x.jsonl")


def test_each_explorer_is_its_own_monitor_run():
    from services.common.config import load_config
    from services.common.monitor import explorer_run_name

    config = load_config(text="name: arith\n")
    assert explorer_run_name(config, "explorer") == "arith_explorer"  # the only explorer
    names = [explorer_run_name(config, f"explorer-{i}") for i in range(2)]  # rft run --explorers 2
    assert names == ["arith_explorer-0", "arith_explorer-1"]
    renamed = load_config(text="name: arith\nexplorer: {name: gen}\n")
    assert explorer_run_name(renamed, "gen") == "arith_explorer"
    assert explorer_run_name(renamed, "gen-1") == "arith_gen-1"


def test_two_explorers_write_two_tensorboard_runs(tmp_path):
    from services.common.config import load_config
    from services.common.monitor import explorer_run_name

    config = load_config(text="name: arith\n")
    for i in range(2):
        mon = build_monitor(
            "tensorboard",
            project="p",
            run_name=explorer_run_name(config, f"explorer-{i}"),
            job_dir=tmp_path,
            metrics_file=f"explorer_explorer-{i}.jsonl",
            console=False,
        )
        for step in (1, 2):
            mon.log({"rollout/reward/mean": i + step / 10}, step=step)
        mon.close()
    runs = sorted(p.name for p in (tmp_path / "monitor").iterdir())
    assert runs == ["arith_explorer-0", "arith_explorer-1"]
    for i, run in enumerate(runs):
        series = tensorboard_series(tmp_path / "monitor" / run)
        assert series == _f32({"rollout/reward/mean": [(1, i + 0.1), (2, i + 0.2)]})
