"""`rft run` with `synchronizer.sync_style: fully_async` (all four services as processes, memory
store, memory weights): the run trains every step and ends cleanly, the explorer never waited for
weights (the synchronizer records no `wait` event; the explorer's `time/wait_for_weights` stays at one
RPC), it took newer versions as the trainer published them (every step's, each sent while the next
step trained), and every trained experience is within the
default staleness bound (4 publishes)."""

from __future__ import annotations

import pytest

from tests.support.rft_run import assert_no_orphans, example, jsonl, run_rft, tiny_model, write_config

pytestmark = pytest.mark.slow

STEPS = 5


def test_fully_async_run_trains_every_step_and_the_explorer_never_waits(tmp_path):
    tree = example("quickstart.yaml")
    tree.pop("stages")
    tree.update(checkpoint_root_dir=str(tmp_path / "ckpt"), continue_from_checkpoint=False)
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"].update(batch_size=2, total_steps=STEPS)
    tree["synchronizer"].update(sync_style="fully_async", sync_interval=1)
    tree["trainer"].update(save_interval=0, save_hf_checkpoint="never")
    tree["monitor"]["monitor_type"] = "none"
    proc = run_rft(write_config(tmp_path / "run.yaml", tree), timeout_s=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)

    run = tmp_path / "ckpt" / "quickstart" / "arithmetic"
    train = jsonl(run / "metrics" / "trainer.jsonl")
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    # staleness: trainer version - experience version, within the default bound 4 x sync_interval
    assert all(0 <= r["sample/staleness/mean"] <= r["sample/staleness/max"] <= 4 for r in train)
    assert sum(r["sample/dropped_stale"] for r in train) == train[-1]["sample/dropped_stale_total"]
    # pipelined: each step's sync runs while the next step trains, so its metrics come with that
    # step (`sync/pipelined`); the last one is flushed when the run ends
    assert [r.get("sync/model_version") for r in train] == [None] + [float(s) for s in range(1, STEPS)]
    assert all(r["sync/pipelined"] == 1.0 for r in train[1:])

    explore = [r for r in jsonl(run / "metrics" / "explorer.jsonl") if "rollout/reward/mean" in r]
    assert explore and [r["step"] for r in explore] == list(range(1, len(explore) + 1))
    waited = [r["time/wait_for_weights"] for r in explore]  # one WaitForVersion RPC per step
    assert max(waited) < 5.0, waited
    assert max(r["rollout/model_version"] for r in explore) > 0  # it took published weights

    events = jsonl(run / "synchronizer" / "events.jsonl")
    assert [e["version"] for e in events if e["kind"] == "publish"] == list(range(1, STEPS + 1))
    waits = [e for e in events if e["kind"] == "wait"]
    assert waits == [], waits  # an explorer blocking on the plan is written as a `wait` event
