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
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

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
        acc = EventAccumulator(str(tmp_path / "monitor" / run))
        acc.Reload()
        events = acc.Scalars("rollout/reward/mean")
        assert [(e.step, round(e.value, 3)) for e in events] == [(1, i + 0.1), (2, i + 0.2)]
