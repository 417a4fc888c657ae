"""Tasksets: the four formats, format keys, bad rows (skip or fatal, with file and row number),
epochs, seeded shuffling, a resumable position, shards and round-robin batches."""

from __future__ import annotations

import json

import pytest

from services.common.config import FormatConfig, TasksetConfig, load_config, resolve
from services.explorer.scheduler import TaskScheduler, all_tasks, open_tasksets
from services.explorer.tasksets import Taskset, TasksetError

ROWS = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(10)]


def _write(tmp_path, kind: str, rows=ROWS):
    import datasets

    if kind == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path = tmp_path / "t.json"
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        path = tmp_path / "t.parquet"
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        path = tmp_path / "saved"
        datasets.DatasetDict(
            {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:3])}
        ).save_to_disk(str(path))
    return str(path)


def _cfg(path, **kw) -> TasksetConfig:
    fmt = FormatConfig(prompt_key="question", response_key="answer")
    return TasksetConfig(path=path, format=fmt, **kw)


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "datasets_folder"])
def test_reads_all_four_formats(tmp_path, kind):
    ts = Taskset(_cfg(_write(tmp_path, kind)), name="t")
    rows = []
    while (got := ts.next_row()) is not None:
        rows.append(got[1])
    assert rows == ROWS and ts.exhausted


def test_datasets_folder_split_is_chosen(tmp_path):
    path = _write(tmp_path, "datasets_folder")
    ts = Taskset(_cfg(path, split="test"), name="t")
    assert len(ts) == 3
    with pytest.raises(TasksetError, match="no split 'dev'"):
        Taskset(_cfg(path, split="dev"), name="t")


def test_bad_rows_are_skipped_and_reported_with_row_number(tmp_path, capsys):
    rows = [*ROWS[:2], {"answer": "3"}, *ROWS[3:5]]
    path = _write(tmp_path, "jsonl", rows)
    ts = Taskset(_cfg(path), name="t")
    got = []
    while (item := ts.next_row()) is not None:
        got.append(item[0])
    assert got == [0, 1, 3, 4] and ts.bad_rows == 1
    with pytest.raises(TasksetError, match=r"t\.jsonl\) row 3: missing key 'question'"):
        strict = Taskset(_cfg(path, on_bad_row="error"), name="t")
        while strict.next_row() is not None:
            pass


def test_unreadable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "1"}\n{not json\n')
    with pytest.raises(TasksetError, match="cannot read taskset"):
        Taskset(_cfg(str(path)), name="t")
    with pytest.raises(TasksetError, match="does not exist"):
        Taskset(_cfg(str(tmp_path / "missing.jsonl")), name="t")


def _drain(ts):
    out = []
    while (got := ts.next_row()) is not None:
        out.append((got[2], got[0]))
    return out


def test_epochs_shuffle_seeded_and_resume(tmp_path):
    path = _write(tmp_path, "jsonl")
    cfg = _cfg(path, data_selector={"selector_type": "shuffle", "seed": 3})
    order = _drain(Taskset(cfg, name="t", total_epochs=2))
    assert len(order) == 20
    first, second = [i for e, i in order if e == 0], [i for e, i in order if e == 1]
    assert sorted(first) == sorted(second) == list(range(10)) and first != second and first != list(range(10))
    assert order == _drain(Taskset(cfg, name="t", total_epochs=2))  # same seed, same order
    other = _cfg(path, data_selector={"selector_type": "shuffle", "seed": 4})
    assert order != _drain(Taskset(other, name="t", total_epochs=2))
    # stop after 13 rows, save, restore into a fresh reader: the rest is the same
    ts = Taskset(cfg, name="t", total_epochs=2)
    head = [ts.next_row()[0] for _ in range(13)]
    resumed = Taskset(cfg, name="t", total_epochs=2)
    resumed.load_state(json.loads(json.dumps(ts.state())))
    assert head + [i for _, i in _drain(resumed)] == [i for _, i in order]


def test_shards_split_rows(tmp_path):
    path = _write(tmp_path, "jsonl")
    a = [i for _, i in _drain(Taskset(_cfg(path), name="t", shard=(0, 2)))]
    b = [i for _, i in _drain(Taskset(_cfg(path), name="t", shard=(1, 2)))]
    assert sorted(a + b) == list(range(10)) and not set(a) & set(b)


def test_scheduler_builds_tasks_with_config_defaults(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    p1, p2 = _write(tmp_path / "a", "jsonl"), _write(tmp_path / "b", "parquet", ROWS[:3])
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(
        f"""
algorithm: {{repeat_times: 4}}
model: {{temperature: 0.9, max_response_tokens: 7}}
buffer:
  batch_size: 4
  total_epochs: 1
  explorer_input:
    default_reward_fn_type: gsm8k
    tasksets:
      - {{name: a, path: {p1}, format: {{prompt_key: question, response_key: answer, system_prompt: be brief}}}}
      - {{name: b, path: {p2}, default_workflow_type: arithmetic, rollout_args: {{temperature: 0.5}},
          format: {{prompt_key: question, response_key: answer}}}}
    eval_tasksets:
      - {{name: e, path: {p2}, repeat_times: 2, format: {{prompt_key: question, response_key: answer}}}}
"""
    )
    resolved = resolve(load_config(str(cfg_file)))
    sched = TaskScheduler(
        open_tasksets(resolved, resolved.tasksets, is_eval=False, needs_response=lambda w: True)
    )
    batch = sched.next_batch(4)
    assert [t.task_id for t in batch] == ["a/0", "b/0", "a/1", "b/1"]
    a0, b0 = batch[0], batch[1]
    assert a0.workflow == "math" and a0.reward_fn == "gsm8k" and a0.repeat_times == 4
    assert a0.messages() == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "0+1"}]
    assert a0.ground_truth == "1" and a0.sampling.temperature == 0.9 and a0.sampling.max_tokens == 7
    assert b0.workflow == "arithmetic" and b0.sampling.temperature == 0.5
    total = len(batch)
    while batch := sched.next_batch(4):
        total += len(batch)
    assert total == 13 and sched.exhausted
    ((ets, efac),) = open_tasksets(
        resolved,
        resolved.config.buffer.explorer_input.eval_tasksets,
        is_eval=True,
        needs_response=lambda w: True,
    )
    tasks = all_tasks(ets, efac)
    assert len(tasks) == 3 and all(t.is_eval and t.repeat_times == 2 for t in tasks)
