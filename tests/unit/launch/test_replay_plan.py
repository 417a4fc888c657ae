"""`rft replay`'s plan (launcher/replay.py): the state a step starts from and the clear refusals, on a
job folder of real files (lineage, checkpoint folders, replay records)."""

from __future__ import annotations

import json

import pytest

from launcher.replay import ReplayError, plan_replay
from services.common.lineage import MARKER, StepLineage, experience_uid, write_lineage
from services.trainer.replay_record import ReplayRecorder
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
