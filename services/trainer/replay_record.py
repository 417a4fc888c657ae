"""Replay records: what `rft replay` needs to run a trainer step again, written by the trainer per step.

One folder per step, `<job_dir>/replay/step_N/`:

    batch.pb     the step's experiences exactly as collated (`rft.v1.ExperienceBatch`, in lease order,
                 after stale-token masking), so a replay trains on the same rows in the same order
    step.json    {"step", "lease_id", "uids", "metrics": the engine's step metrics, "weights": one
                 [hash, sum, l2 norm] per policy tensor after the step, "threads": torch's intra-op
                 threads (a CPU sum's order depends on them: a replay uses as many)}; written last
                 (a folder without it is incomplete and ignored)

The per-tensor digest (`tensor_digests`: blake2b of the tensor's bytes, plus its float64 sum and norm)
is what a replay compares its weights with when no checkpoint of step N is on disk: the hash for bit
exactness, sum and norm within a tolerance (on a GPU). Retention: the newest `keep_steps` steps, and
of those no more than `keep_bytes` (oldest first; the newest step always stays). On resume the
records of steps after the restored checkpoint are discarded (those steps are trained again).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.common.experience import Experience, batch_from_proto, batch_to_proto
from services.common.lineage import experience_uid

__all__ = ["ReplayRecorder", "StepRecord", "read_record", "record_steps", "replay_dir", "tensor_digests"]

BATCH_FILE = "batch.pb"
STEP_FILE = "step.json"


def replay_dir(job_dir: Path) -> Path:
    return Path(job_dir) / "replay"


def _step_folder(job_dir: Path, step: int) -> Path:
    return replay_dir(job_dir) / f"step_{step}"


def tensor_digests(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list[Any]]:
    """{name: [blake2b-64 of the bytes, float64 sum, float64 l2 norm]} in iteration order."""
    out: dict[str, list[Any]] = {}
    for name, tensor in named:
        t = tensor.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        wide = t.to(torch.float64)
        out[name] = [
            hashlib.blake2b(raw, digest_size=8).hexdigest(),
            float(wide.sum()),
            float(wide.norm()),
        ]
    return out


@dataclass(frozen=True)
class StepRecord:
    step: int
    lease_id: str
    uids: tuple[str, ...]
    metrics: dict[str, float]
    weights: dict[str, list[Any]]
    folder: Path
    threads: int = 0  # torch.get_num_threads() of the trainer (0: not recorded)

    def experiences(self) -> list[Experience]:
        from rft.v1 import experience_pb2

        msg = experience_pb2.ExperienceBatch.FromString((self.folder / BATCH_FILE).read_bytes())
        return batch_from_proto(msg)


def read_record(job_dir: Path, step: int) -> StepRecord | None:
    """Step `step`'s record, None when it is not kept (never written, past retention or incomplete)."""
    folder = _step_folder(job_dir, step)
    path = folder / STEP_FILE
    if not path.is_file() or not (folder / BATCH_FILE).is_file():
        return None
    obj = json.loads(path.read_text())
    return StepRecord(
        int(obj["step"]), str(obj["lease_id"]), tuple(obj["uids"]), dict(obj["metrics"]),
        dict(obj["weights"]), folder, int(obj.get("threads", 0)),
    )  # fmt: skip


def record_steps(job_dir: Path) -> list[int]:
    """The steps with a complete record, ascending."""
    root = replay_dir(job_dir)
    steps = []
    for folder in root.glob("step_*") if root.is_dir() else ():
        suffix = folder.name.removeprefix("step_")
        if suffix.isdigit() and (folder / STEP_FILE).is_file():
            steps.append(int(suffix))
    return sorted(steps)


def _all_steps(job_dir: Path) -> list[int]:
    root = replay_dir(job_dir)
    found = [f.name.removeprefix("step_") for f in root.glob("step_*")] if root.is_dir() else []
    return sorted(int(s) for s in found if s.isdigit())


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


class ReplayRecorder:
    """Writes each trained step's record and trims the records to the retention."""

    def __init__(self, job_dir: Path, keep_steps: int, keep_bytes: int | None = None):
        self.job_dir = Path(job_dir)
        self.keep_steps = keep_steps
        self.keep_bytes = keep_bytes

    def write(
        self,
        step: int,
        lease_id: str,
        experiences: Sequence[Experience],
        metrics: Mapping[str, float],
        weights: Mapping[str, list[Any]],
    ) -> Path:
        folder = _step_folder(self.job_dir, step)
        if folder.exists():  # a step trained again after a resume
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        (folder / BATCH_FILE).write_bytes(batch_to_proto(list(experiences)).SerializeToString())
        record = {
            "step": step,
            "lease_id": lease_id,
            "uids": [experience_uid(e.eid) for e in experiences],
            "metrics": {k: float(v) for k, v in metrics.items()},
            "weights": dict(weights),
            "threads": torch.get_num_threads(),
        }
        tmp = folder / (STEP_FILE + ".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(folder / STEP_FILE)  # the record is complete once step.json is there
        self.trim(step)
        return folder

    def trim(self, newest: int) -> list[int]:
        """Delete records older than the retention (by steps, then by bytes); returns the steps deleted."""
        gone = []
        steps = _all_steps(self.job_dir)
        for s in steps:
            if s <= newest - self.keep_steps:
                shutil.rmtree(_step_folder(self.job_dir, s), ignore_errors=True)
                gone.append(s)
        if self.keep_bytes is not None:
            kept = [s for s in steps if s not in gone]
            sizes = {s: _folder_bytes(_step_folder(self.job_dir, s)) for s in kept}
            total = sum(sizes.values())
            for s in kept[:-1]:  # oldest first; the newest stays
                if total <= self.keep_bytes:
                    break
                shutil.rmtree(_step_folder(self.job_dir, s), ignore_errors=True)
                total -= sizes[s]
                gone.append(s)
        return sorted(gone)

    def discard_after(self, step: int) -> list[int]:
        """Delete the records of steps after `step` (a resume trains them again)."""
        gone = [s for s in _all_steps(self.job_dir) if s > step]
        for s in gone:
            shutil.rmtree(_step_folder(self.job_dir, s), ignore_errors=True)
        return gone
