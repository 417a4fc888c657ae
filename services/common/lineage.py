"""Lineage: which experiences a run's trainer steps trained, recorded in every checkpoint.

Each experience is named by `experience_uid` (explorer, group, run and suffix of its `eid`: unique per
sampled sequence, since an explorer's group ids carry its id, the step's batch id and the task). The
buffer records the uid of every experience it accepts (its accepted log); the trainer writes the uids
of each step into `global_step_N/lineage.jsonl` (every step up to N, one JSON object per line:
`{"step": s, "lease_id": ..., "uids": [...]}`), so comparing the two tells what was produced, trained
once, trained twice or lost (`rft audit`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

LINEAGE_FILE = "lineage.jsonl"
MARKER = "latest_checkpointed_iteration.txt"  # written by the trainer once a step folder is complete


class _Eid(Protocol):
    explorer_id: str
    group_id: str
    run_id: int
    suffix: str


def experience_uid(eid: _Eid) -> str:
    """The experience's unique name (works on `ExperienceId` and on the proto `rft.v1.ExperienceId`)."""
    return f"{eid.explorer_id}/{eid.group_id}/{eid.run_id}/{eid.suffix}"


@dataclass(frozen=True)
class StepLineage:
    """What one trainer step trained: the lease it came in and the experiences' uids."""

    step: int
    lease_id: str
    uids: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "lease_id": self.lease_id, "uids": list(self.uids)})

    @classmethod
    def from_json(cls, line: str) -> StepLineage:
        obj: dict[str, Any] = json.loads(line)
        return cls(int(obj["step"]), str(obj.get("lease_id", "")), tuple(obj["uids"]))


def write_lineage(folder: Path, steps: Iterable[StepLineage]) -> None:
    (Path(folder) / LINEAGE_FILE).write_text("".join(s.to_json() + "\n" for s in steps))


def read_lineage(folder: Path) -> list[StepLineage]:
    """The lineage of a checkpoint folder ([] for a checkpoint written before lineage existed)."""
    path = Path(folder) / LINEAGE_FILE
    if not path.is_file():
        return []
    return [StepLineage.from_json(line) for line in path.read_text().splitlines() if line.strip()]


def latest_checkpoint(job_dir: Path) -> Path | None:
    """The durable step folder the marker names (None when there is none)."""
    marker = Path(job_dir) / MARKER
    text = marker.read_text().strip() if marker.is_file() else ""
    return Path(job_dir) / f"global_step_{text}" if text.isdigit() else None
