"""`rft run` (all four services as processes, 3 GRPO steps on the tiny model, an evaluation at the last
one: `eval/arithmetic/.../mean@2`, names mlflow refuses as they are) with each monitor backend:
the trainer's and the explorer's runs, read back with the backend's own library (tensorboard's
EventAccumulator, wandb's offline run file, mlflow's MlflowClient on the run's SQLite store), hold
every metric of `metrics/trainer.jsonl` and `metrics/explorer.jsonl` at the same steps with the same
values (tensorboard's at float32, its scalar type).

The tensorboard run also traces (docs/traces.md), turned on by the standard OTEL_* variables alone and
exported to a real OTLP/HTTP receiver the test starts (tests/support/otlp_receiver.py): spans arrive from
all four services, and one trainer step's trace holds the trainer's phases, the buffer's GetBatch and the
synchronizer's side of the weight publish, its get-batch span linking to the explorer's puts."""

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
from tests.support.otlp_receiver import OTLPReceiver
from tests.support.rft_run import assert_no_orphans, example, run_rft, tiny_model, write_config

pytestmark = pytest.mark.slow

STEPS = 3
ARGS = {"tensorboard": {}, "wandb": {"mode": "offline"}, "mlflow": {"tags": {"test": "e2e"}}}


def _f32(series):
    return {
        k: [(s, None if v is None else float(np.float32(v))) for s, v in pts] for k, pts in series.items()
    }


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
    with OTLPReceiver() as receiver:
        traced = receiver.environ() if backend == "tensorboard" else {}
        proc = run_rft(write_config(tmp_path / "run.yaml", tree), timeout_s=150, extra_env=traced)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)
    if traced:
        _assert_traces_link_up(receiver.spans)

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


def _assert_traces_link_up(spans):
    services = {"rft-trainer", "rft-explorer", "rft-buffer", "rft-synchronizer"}
    assert {s.service for s in spans} == services
    steps = [s for s in spans if s.name == "trainer.step" and s.attributes.get("rft.step") == 2]
    assert len(steps) == 1, sorted({s.name for s in spans})
    trace = [s for s in spans if s.trace_id == steps[0].trace_id]
    names = {(s.service, s.name) for s in trace}
    for phase in ("get_batch", "update", "forward_backward", "optimizer", "publish", "sync.push"):
        assert ("rft-trainer", f"trainer.{phase}") in names, phase
    assert ("rft-buffer", "rft.v1.BufferService/GetBatch") in names
    assert "rft-synchronizer" in {s.service for s in trace}  # the weight publish's other side
    (get_batch,) = [s for s in trace if s.name == "trainer.get_batch"]
    puts = {(s.trace_id, s.span_id): s for s in spans if s.name == "explorer.put"}
    assert get_batch.links and all(link in puts for link in get_batch.links)
    put = puts[get_batch.links[0]]
    assert put.service == "rft-explorer"
    # the put's own trace: the explorer's step, and the buffer storing the experiences
    put_trace = {(s.service, s.name) for s in spans if s.trace_id == put.trace_id}
    for phase in ("step", "rollout", "task", "generate", "reward"):
        assert ("rft-explorer", f"explorer.{phase}") in put_trace, phase
    assert any(svc == "rft-buffer" and name.startswith("rft.v1.BufferService/Put") for svc, name in put_trace)
    # the explorer's side of a weight sync: the fetch pulls from the synchronizer, then the load
    (fetch, *_) = [s for s in spans if s.name == "explorer.sync.fetch"]
    fetch_trace = {(s.service, s.name) for s in spans if s.trace_id == fetch.trace_id}
    assert ("rft-synchronizer", "rft.v1.SynchronizerService/PullWeights") in fetch_trace
    assert ("rft-explorer", "explorer.sync.apply") in fetch_trace
    by_id = {s.span_id: s for s in trace}
    for s in trace:  # every span's parent is in the trace (the trace is whole, across processes)
        assert not s.parent_span_id or s.parent_span_id in by_id, (s.service, s.name)
