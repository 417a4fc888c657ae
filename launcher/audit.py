"""`rft audit JOB_DIR`: did every experience the buffer accepted land in the final model exactly once?

It compares two records: the buffer's accepted log (with the Redis store, the list `<prefix>:accepted`
that the buffer appends to atomically with every put) and the lineage of the job's last durable
checkpoint (`global_step_N/lineage.jsonl`: the uids every step trained). Experiences still stored in
the buffer at the end (explored but never needed: the run reached `total_steps` first) are counted
apart, read from the stream and its payloads (`<prefix>:data`). The counts:

    produced        experiences the buffer accepted
    trained_once    accepted, and trained by exactly one step of the final model
    trained_twice   trained by two steps or more (should be 0)
    lost            accepted, not trained, and no longer in the buffer (should be 0)
    remaining       accepted, not trained, still in the buffer
    unknown         trained, but never accepted (should be 0)

With the memory store the accepted log died with the buffer; only `trained_twice` can be checked.
A client of the buffer's store and of the job folder, never of a service's code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from services.common.lineage import experience_uid, latest_checkpoint, read_lineage

__all__ = ["Audit", "audit_job", "compare"]


@dataclass(frozen=True)
class Audit:
    steps: int
    produced: int | None
    trained_once: int
    trained_twice: int
    lost: int | None
    remaining: int | None
    unknown: int | None
    checkpoint: str

    @property
    def ok(self) -> bool:
        return self.trained_twice == 0 and not self.lost and not self.unknown

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"ok": self.ok}


def compare(
    accepted: Iterable[str] | None, trained: Iterable[str], remaining: Iterable[str] | None, *, steps: int = 0,
    checkpoint: str = "",
) -> Audit:  # fmt: skip
    """The counts above from the three uid lists (None: that record is not available)."""
    times = Counter(trained)
    once = sum(1 for c in times.values() if c == 1)
    twice = sum(1 for c in times.values() if c > 1)
    if accepted is None:
        return Audit(steps, None, once, twice, None, None, None, checkpoint)
    produced = list(accepted)
    accepted_set = set(produced)
    left = set(remaining or ()) - set(times)
    lost = accepted_set - set(times) - left
    unknown = set(times) - accepted_set
    return Audit(
        steps, len(produced), once, twice, len(lost), len(left & accepted_set), len(unknown), checkpoint
    )


def _job_config(job_dir: Path) -> dict:
    path = job_dir / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def redis_records(url: str, prefix: str) -> tuple[list[str], list[str]]:
    """(accepted log, uids of the experiences still stored) of a Redis store."""
    import redis
    from rft.v1 import buffer_pb2

    client = redis.Redis.from_url(url)
    try:
        accepted = [u.decode() for u in client.lrange(f"{prefix}:accepted", 0, -1)]
        remaining = []
        data = client.hgetall(f"{prefix}:data")  # stream entry id -> payload
        for entry_id, fields in client.xrange(f"{prefix}:stream", "-", "+"):
            payload = fields.get(b"d") or data.get(entry_id, b"")  # `d`: written by an older buffer
            for exp in buffer_pb2.GetBatchResponse.FromString(payload).experiences:
                remaining.append(experience_uid(exp.eid))
    finally:
        client.close()
    return accepted, remaining


def audit_job(job_dir: Path, redis_url: str | None = None) -> Audit:
    """Audit the job folder written by `rft run` (its config.yaml names the buffer's store)."""
    folder = latest_checkpoint(Path(job_dir))
    lineage = read_lineage(folder) if folder is not None else []
    trained = [uid for step in lineage for uid in step.uids]
    buffer = (_job_config(job_dir).get("services") or {}).get("buffer") or {}
    accepted = remaining = None
    if buffer.get("store") == "redis" or redis_url:
        accepted, remaining = redis_records(
            redis_url or buffer.get("redis_url", "redis://127.0.0.1:6379/0"),
            buffer.get("stream_prefix", "rft"),
        )
    return compare(accepted, trained, remaining, steps=len(lineage), checkpoint=str(folder or ""))
