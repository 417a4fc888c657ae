"""Monitors: JSON lines per step (NaN as null), console line, clear error for a missing backend."""

from __future__ import annotations

import io
import json

import pytest

from services.common.monitor import ConsoleMonitor, build_monitor


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


def test_missing_backend_package_is_a_clear_error(tmp_path):
    pytest.importorskip("torch")
    try:
        import wandb  # noqa: F401

        pytest.skip("wandb is installed here")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match="'wandb' is not installed"):
        build_monitor("wandb", project="p", run_name="r", job_dir=tmp_path, metrics_file="x.jsonl")
