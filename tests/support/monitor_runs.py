"""Read back what a monitor backend wrote, with each library's own reader, as {metric: [(step, value)]}
series to compare with the run's `metrics/*.jsonl` (a null there, JSON's NaN/inf, is None here too).

- tensorboard: `EventAccumulator` over a run folder (values are float32, tensorboard's scalar type);
- wandb: the offline run's transaction log `run-<id>.wandb`, decoded into wandb's own protobuf
  `Record`s (the Python SDK no longer ships a reader of that file; its framing is LevelDB's log format:
  a 7-byte file header, 32 KiB blocks of crc32-checked chunks);
- mlflow: `MlflowClient(tracking_uri).get_metric_history` for every metric of the named run.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

Series = dict[str, list[tuple[int, float | None]]]

_BLOCK, _CHUNK_HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _value(v: float) -> float | None:
    return v if math.isfinite(v) else None


def jsonl_series(path: Path) -> Series:
    out: Series = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        step = row.pop("step")
        for key, value in row.items():
            out.setdefault(key, []).append((step, value))
    return out


def last_per_step(series: Series) -> Series:
    """One point per (metric, step), the last logged: what a backend that keeps one row per step holds."""
    return {k: sorted(dict(points).items()) for k, points in series.items()}


def tensorboard_series(log_dir: Path) -> Series:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={SCALARS: 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, _value(e.value)) for e in acc.Scalars(tag)] for tag in acc.Tags()[SCALARS]}


def wandb_records(path: Path) -> Iterator[object]:
    """The `wandb_internal_pb2.Record`s of a `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0), f"{path} is not a wandb run file"
    pos, pending = 7, b""
    while pos + _CHUNK_HEADER <= len(data):
        room = _BLOCK - pos % _BLOCK
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        if room < _CHUNK_HEADER or (kind, length) == (0, 0):  # the zero padding that ends a block
            pos += room
            continue
        chunk = data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"bad checksum at {pos}"
        pos += _CHUNK_HEADER + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_run(path: Path) -> tuple[str | None, Series]:
    """(display name, history) of one offline run file; the name is None when the file holds no run record
    (wandb-core 0.31 was once seen writing the history of an offline run without it, under heavy load)."""
    name, series = None, {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            name = record.run.display_name
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            step = items.pop("_step")
            for key, value in items.items():
                if not key.startswith("_"):  # wandb's own _timestamp, _runtime
                    series.setdefault(key, []).append((step, _value(float(value))))
    return name, series


def wandb_run_files(monitor_dir: Path) -> dict[str, Path]:
    """{run id: its `run-<id>.wandb` file} for every offline run under `<job_dir>/monitor/wandb/`."""
    return {
        p.stem.removeprefix("run-"): p for p in sorted(monitor_dir.glob("wandb/offline-run-*/run-*.wandb"))
    }


def wandb_runs(monitor_dir: Path) -> dict[str, Series]:
    """{run display name: its history} for every offline run under `<job_dir>/monitor/wandb/`."""
    runs: dict[str, Series] = {}
    for path in wandb_run_files(monitor_dir).values():
        name, series = wandb_run(path)
        kinds = [r.WhichOneof("record_type") for r in wandb_records(path)]
        assert name is not None and name not in runs, (
            f"{path}: no run record, or a second run {name!r}: {kinds}"
        )
        runs[name] = series
    return runs


def mlflow_series(tracking_uri: str, experiment: str, run_name: str) -> Series:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no mlflow experiment {experiment!r} in {tracking_uri}"
    runs = client.search_runs([found.experiment_id], filter_string=f"attributes.run_name = '{run_name}'")
    assert len(runs) == 1, f"{len(runs)} mlflow runs named {run_name!r}"
    run = runs[0]
    assert run.info.status == "FINISHED", run.info.status
    out: Series = {}
    for key in run.data.metrics:
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp))
        out[key] = [(m.step, _value(m.value)) for m in history]
    return out
