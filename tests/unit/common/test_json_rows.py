"""`services.common.json_rows`: jsonl/json rows without `datasets`, the same rows `datasets` reads, and
the taskset / offline-data readers falling back to it where `datasets` is not installed (a subprocess
whose import system refuses `datasets`, as on the GPU machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.json_rows import JsonRowsError, read_json_rows

ROOT = Path(__file__).resolve().parents[3]
ROWS = [
    {"question": "1+2=", "answer": "3"},
    {"question": "2+2=", "answer": "4", "level": 2},
    {"question": "x"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    return path


def test_rows_equal_what_datasets_reads(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = _jsonl(tmp_path / "t.jsonl", ROWS)
    ours = read_json_rows(path)
    theirs = datasets.load_dataset("json", data_files=str(path), split="train").to_list()
    assert ours == theirs
    assert ours[2] == {"question": "x", "answer": None, "level": None}


def test_json_list_and_data_object(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(ROWS[:2]))
    (tmp_path / "b.json").write_text(json.dumps({"data": ROWS[:2]}))
    want = [
        {"question": "1+2=", "answer": "3", "level": None},
        {"question": "2+2=", "answer": "4", "level": 2},
    ]
    assert read_json_rows(tmp_path / "a.json") == want
    assert read_json_rows(tmp_path / "b.json") == want


def test_bad_input_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": 1}\n{"q": \n')
    with pytest.raises(JsonRowsError, match=r"bad.jsonl line 2: not JSON"):
        read_json_rows(bad)
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    with pytest.raises(JsonRowsError, match=r"line 1: not a JSON object"):
        read_json_rows(tmp_path / "list.jsonl")
    with pytest.raises(JsonRowsError, match=r"needs the `datasets` library"):
        read_json_rows(tmp_path / "t.parquet")


_WITHOUT_DATASETS = """
import sys
sys.modules["datasets"] = None  # `import datasets` raises ImportError, as where it is not installed
from services.explorer.tasksets import load_rows as taskset_rows
from launcher.offline_data import load_rows as offline_rows
path = sys.argv[1]
print(repr((taskset_rows(path), offline_rows(path))))
"""


def test_readers_fall_back_without_datasets(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", ROWS)
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DATASETS, str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    taskset, offline = eval(proc.stdout)  # noqa: S307 - our own repr of plain dicts
    assert taskset == offline == read_json_rows(path)
