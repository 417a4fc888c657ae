"""`rft replay` (services/trainer/replay.py) on a job folder of real files (lineage, checkpoint folders, replay
records): the state a step starts from, the clear refusals, and the comparison that names the first
tensor that differs (with its max abs diff from the step's checkpoint) and every differing metric."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from services.common.lineage import MARKER, StepLineage, experience_uid, write_lineage
from services.trainer.replay import ReplayError, StepReplay, compare_metrics, compare_weights, plan_replay
from services.trainer.replay_record import ReplayRecorder, read_record, tensor_digests
from tests.support.trainer_data import make_experiences

KEEP = {"replay_keep_steps": 3, "replay_keep_bytes": None}


def job(tmp_path, checkpoints, records, trained=6):
    batches = {s: make_experiences(4, seed=s) for s in range(1, trained + 1)}
    lineage = [StepLineage(s, f"l{s}", tuple(experience_uid(e.eid) for e in b)) for s, b in batches.items()]
    for step in checkpoints:
        folder = tmp_path / f"global_step_{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        write_lineage(folder, [s for s in lineage if s.step <= step])
    (tmp_path / MARKER).write_text(str(max(checkpoints)))
    recorder = ReplayRecorder(tmp_path, keep_steps=100)
    for step in records:
        recorder.write(step, f"l{step}", batches[step], {}, {})
    return tmp_path


def test_a_step_starts_from_the_newest_checkpoint_the_records_reach(tmp_path):
    root = job(tmp_path, [2, 4, 6], [3, 4, 5, 6])
    base, records = plan_replay(root, 6, KEEP)
    assert (base, [r.step for r in records]) == (4, [5, 6])
    assert plan_replay(root, 4, KEEP)[0] == 2  # checkpoint 3 does not exist: 2, then steps 3 and 4
    assert [r.step for r in plan_replay(root, 4, KEEP)[1]] == [3, 4]


def test_the_refusals_say_why(tmp_path):
    root = job(tmp_path, [4, 6], [2, 3, 5, 6])
    with pytest.raises(
        ReplayError, match="step 1 is past the replay retention: records are kept for steps 2..6"
    ):
        plan_replay(root, 1, KEEP)
    with pytest.raises(ReplayError, match="no saved state precedes step 3 within the retention"):
        plan_replay(root, 3, KEEP)  # records 2 and 3 but not 1, and no checkpoint before 4
    with pytest.raises(ReplayError, match="step 7 is not in the lineage"):
        plan_replay(root, 7, KEEP)
    with pytest.raises(ReplayError, match="kept no replay records"):
        plan_replay(root, 1, {"replay_keep_steps": 0})
    ReplayRecorder(tmp_path, keep_steps=100).write(6, "other", make_experiences(4, seed=99), {}, {})
    with pytest.raises(ReplayError, match="record of step 6 holds another batch"):
        plan_replay(root, 6, KEEP)


def test_the_comparison_names_the_first_tensor_that_differs_and_the_metrics(tmp_path):
    weights = {"a": torch.linspace(0, 1, 16), "b": torch.linspace(-1, 1, 32), "c": torch.ones(4)}
    exps = make_experiences(4, seed=5)
    ReplayRecorder(tmp_path, keep_steps=3).write(
        2, "l2", exps, {"actor/loss": 0.5, "timing_s/x": 1.0}, tensor_digests(weights.items())
    )
    record = read_record(tmp_path, 2)
    same = StepReplay(2, 1)
    compare_weights(tmp_path, record, {k: v.clone() for k, v in weights.items()}, 0.0, same)
    compare_metrics(record.metrics, {"actor/loss": 0.5, "timing_s/x": 9.0}, 0.0, same)
    assert same.ok and (same.tensors, same.metrics_compared) == (3, 1)

    replayed = {k: v.clone() for k, v in weights.items()}
    replayed["b"][5] = torch.nextafter(replayed["b"][5], torch.tensor(9.0))
    replayed["c"] += 1
    off = StepReplay(2, 1)
    compare_weights(tmp_path, record, replayed, 0.0, off)
    compare_metrics(record.metrics, {"actor/loss": 0.5000001}, 0.0, off)
    assert off.first_tensor == "b" and off.max_abs_diff is None  # no checkpoint of step 2: the digest only
    assert off.metrics_differing == {"actor/loss": (0.5, 0.5000001)}
    assert "first tensor that differs: b" in "\n".join(off.lines())

    (tmp_path / "global_step_2" / "actor").mkdir(parents=True)
    save_file(weights, str(tmp_path / "global_step_2" / "actor" / "model.safetensors"))
    saved = StepReplay(2, 1)
    compare_weights(tmp_path, record, replayed, 0.0, saved)
    ulp = float(replayed["b"][5] - weights["b"][5])
    assert saved.first_tensor == "b" and saved.max_abs_diff == pytest.approx(ulp) and 0 < ulp < 1e-6
    near = StepReplay(2, 1)  # within a GPU-style tolerance the ulp passes, the +1 does not
    compare_weights(tmp_path, record, replayed, 1e-3, near)
    assert near.first_tensor == "c" and near.max_abs_diff == 1.0
