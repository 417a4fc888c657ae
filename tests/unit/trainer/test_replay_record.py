"""Replay records (services/trainer/replay_record.py): the batch comes back exactly as written, the
weight digest sees a one-ulp change, and retention by steps and by bytes keeps the newest records."""

from __future__ import annotations

import torch

from services.common.experience import experiences_equal
from services.common.lineage import experience_uid
from services.trainer.replay_record import (
    ReplayRecorder,
    read_record,
    record_steps,
    replay_dir,
    tensor_digests,
)
from tests.support.trainer_data import make_experiences


def test_a_record_gives_back_the_batch_in_order_with_metrics_and_digest(tmp_path):
    exps = make_experiences(8, seed=3)
    exps[2].action_mask = torch.tensor(
        [True, False] * (exps[2].response_length // 2) + [True] * (exps[2].response_length % 2)
    )
    digest = tensor_digests([("w", torch.ones(3)), ("b", torch.zeros(0))])
    ReplayRecorder(tmp_path, keep_steps=5).write(4, "lease-9", exps, {"actor/loss": 0.25}, digest)
    record = read_record(tmp_path, 4)
    assert record is not None and (record.step, record.lease_id) == (4, "lease-9")
    assert record.uids == tuple(experience_uid(e.eid) for e in exps)
    assert record.metrics == {"actor/loss": 0.25} and record.weights == digest
    assert record.threads == torch.get_num_threads()
    back = record.experiences()
    assert len(back) == len(exps) and all(experiences_equal(a, b) for a, b in zip(exps, back, strict=True))
    assert read_record(tmp_path, 3) is None


def test_the_digest_sees_one_ulp():
    w = torch.linspace(-1, 1, 64)
    nudged = w.clone()
    nudged[17] = torch.nextafter(nudged[17], torch.tensor(2.0))
    a, b = tensor_digests([("w", w)]), tensor_digests([("w", w.clone())])
    assert a == b
    assert tensor_digests([("w", nudged)])["w"][0] != a["w"][0]


def test_retention_by_steps_and_bytes_and_discard_after_a_resume(tmp_path):
    exps = make_experiences(4, seed=1)
    recorder = ReplayRecorder(tmp_path, keep_steps=3)
    for step in range(1, 7):
        recorder.write(step, f"l{step}", exps, {}, {})
    assert record_steps(tmp_path) == [4, 5, 6]
    (replay_dir(tmp_path) / "step_7").mkdir()  # cut short before step.json: not a record
    assert record_steps(tmp_path) == [4, 5, 6] and read_record(tmp_path, 7) is None
    assert recorder.discard_after(5) == [6, 7] and record_steps(tmp_path) == [4, 5]
    one = sum(f.stat().st_size for f in (replay_dir(tmp_path) / "step_5").iterdir())
    by_bytes = ReplayRecorder(tmp_path, keep_steps=10, keep_bytes=2 * one + one // 2)
    by_bytes.write(6, "l6", exps, {}, {})
    assert record_steps(tmp_path) == [5, 6]
    ReplayRecorder(tmp_path, keep_steps=10, keep_bytes=1).write(7, "l7", exps, {}, {})
    assert record_steps(tmp_path) == [7]  # the newest stays whatever its size
