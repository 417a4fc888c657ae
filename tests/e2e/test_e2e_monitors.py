"""`rft run` (all four services as processes, 3 GRPO steps on the tiny model, an evaluation at the last
one: `eval/arithmetic/.../mean@2`, names mlflow refuses as they are) with each monitor backend:
the trainer's and the explorer's runs, read back with the backend's own library (tensorboard's
EventAccumulator, wandb's offline run file, mlflow's MlflowClient on the run's SQLite store), hold
every metric of `metrics/trainer.jsonl` and `metrics/explorer.jsonl` at the same steps with the same
values (tensorboard's at float32, its scalar type)."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.monitor import mlflow_metric_name
from tests.support.monitor_runs import (
    jsonl_series,
    last_per_step,
    mlflow_series,
    tensorboard_series,
    wandb_runs,
)
from tests.support.rft_run import assert_no_orphans, example, run_rft, tiny_model, write_config

pytestmark = pytest.mark.slow

STEPS = 3
ARGS = {"tensorboard": {}, "wandb": {"mode": "offline"}, "mlflow": {"tags": {"test": "e2e"}}}


def _f32(series):
    return {k: [(s, None if v is None else float(np.float32(v))) for s, v in pts] for k, pts in series.items()}


@pytest.mark.parametrize("backend", ["tensorboard", "wandb", "mlflow"])
def test_monitor_backend_holds_every_jsonl_line(tmp_path, backend):
    tree = example("quickstart.yaml")
    tree.pop("stages")
    tree.update(checkpoint_root_dir=str(tmp_path / "ckpt"), continue_from_checkpoint=False)
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"].update(batch_size=2, total_steps=STEPS)
    taskset = tree["buffer"]["explorer_input"]["taskset"]
    tree["buffer"]["explorer_input"]["eval_tasksets"] = [{**taskset, "repeat_times": 2}]
    tree["explorer"].update(eval_on_startup=False, eval_interval=STEPS)
    tree["trainer"].update(save_interval=0, save_hf_checkpoint="never")
    tree["monitor"] = {"monitor_type": backend, "monitor_args": ARGS[backend]}
    proc = run_rft(write_config(tmp_path / "run.yaml", tree), timeout_s=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)

    job = tmp_path / "ckpt" / "quickstart" / "arithmetic"
    expected = {
        "arithmetic_trainer": jsonl_series(job / "metrics" / "trainer.jsonl"),
        "arithmetic_explorer": jsonl_series(job / "metrics" / "explorer.jsonl"),
    }
    train = expected["arithmetic_trainer"]["actor/pg_loss"]
    assert [s for s, _ in train] == list(range(1, STEPS + 1))
    explore = expected["arithmetic_explorer"]
    assert [s for s, _ in explore["rollout/reward/mean"]] == list(range(1, STEPS + 1))
    assert [s for s, _ in explore["eval/arithmetic/accuracy/mean@2"]] == [STEPS]

    if backend == "tensorboard":
        for run, series in expected.items():
            assert tensorboard_series(job / "monitor" / run) == _f32(series), run
    elif backend == "wandb":
        runs = wandb_runs(job / "monitor")
        assert sorted(runs) == sorted(expected)
        for run, series in expected.items():
            assert runs[run] == last_per_step(series), run
    else:
        uri = f"sqlite:///{job.resolve() / 'monitor' / 'mlflow.db'}"
        for run, series in expected.items():
            got = mlflow_series(uri, "quickstart", run)
            assert got == {mlflow_metric_name(k): v for k, v in series.items()}, run
