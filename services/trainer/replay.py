"""`rft replay JOB_DIR --step N` (`python -m services.trainer.replay`): train step N again, as the run did, and compare with what it recorded.

The state before step N is the newest checkpoint M < N of the job (or the initial model, M = 0) from
which the trainer's replay records (`services/trainer/replay_record.py`) cover every step M+1..N. Each
of those steps is trained again with the trainer's own engine (one process, the run's config) on the
recorded batch (the experiences the lineage names for that step, in the same order; the engine splits
them into the same mini- and micro-batches), and after each the weights and the engine's metrics are
compared with the record: bit for bit on the CPU (`tolerance` 0), within `tolerance` on a GPU. The
first tensor that differs is named, with its max abs diff when a checkpoint of that step is on disk
(otherwise its sum and norm against the recorded ones). Timing and throughput metrics are not compared.

`ReplayError` (exit 2) says why a step cannot be replayed: not trained by the job's latest checkpoint,
past the records' retention, no saved state before it within retention, or a multi-rank trainer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from services.common.lineage import latest_checkpoint, read_lineage
from services.trainer.replay_record import StepRecord, read_record, record_steps, tensor_digests

__all__ = ["ReplayError", "StepReplay", "compare_metrics", "compare_weights", "plan_replay", "replay_steps"]

UNCOMPARED = ("timing_s/", "perf/throughput", "perf/time_per_step")


class ReplayError(RuntimeError):
    """Step N cannot be replayed (the message says why and what to change)."""


@dataclasses.dataclass
class StepReplay:
    """The outcome of one replayed step."""

    step: int
    base: int  # the checkpoint it started from (0: the initial model)
    tensors: int = 0
    metrics_compared: int = 0
    first_tensor: str = ""  # the first tensor that differs ("" none)
    max_abs_diff: float | None = None  # of that tensor, when a checkpoint of the step is on disk
    tensor_detail: str = ""
    metrics_differing: dict[str, tuple[float, float]] = dataclasses.field(
        default_factory=dict
    )  # recorded, replayed

    @property
    def ok(self) -> bool:
        return not self.first_tensor and not self.metrics_differing

    def lines(self) -> list[str]:
        head = (
            f"step {self.step} (from {'the initial model' if self.base == 0 else f'checkpoint {self.base}'})"
        )
        if self.ok:
            return [f"{head}: match: {self.tensors} tensors and {self.metrics_compared} metrics as recorded"]
        out = [f"{head}: DIFFERS"]
        if self.first_tensor:
            diff = f", max abs diff {self.max_abs_diff:.3g}" if self.max_abs_diff is not None else ""
            out.append(f"  first tensor that differs: {self.first_tensor}{diff}{self.tensor_detail}")
        for name, (was, now) in self.metrics_differing.items():
            out.append(f"  metric {name}: recorded {was!r}, replayed {now!r}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"ok": self.ok}


def _checkpoint_steps(job_dir: Path, durable: int) -> list[int]:
    steps = []
    for folder in job_dir.glob("global_step_*"):
        suffix = folder.name.removeprefix("global_step_")
        if suffix.isdigit() and int(suffix) <= durable and (folder / "trainer_state.json").is_file():
            steps.append(int(suffix))
    return sorted(steps)


def _span(steps: list[int]) -> str:
    return f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"


def plan_replay(job_dir: Path, step: int, keep: dict[str, Any] | None = None) -> tuple[int, list[StepRecord]]:
    """(base checkpoint step, the records of steps base+1..step) or `ReplayError` saying why not."""
    keep = keep or {}
    latest = latest_checkpoint(job_dir)
    if latest is None:
        raise ReplayError(f"{job_dir}: no checkpoint (latest_checkpointed_iteration.txt); nothing to replay")
    lineage = {s.step: s for s in read_lineage(latest)}
    durable = int(latest.name.removeprefix("global_step_"))
    if step not in lineage:
        raise ReplayError(
            f"step {step} is not in the lineage of the job's latest checkpoint ({latest.name}: "
            f"{_span(sorted(lineage))}); replay a step it trained"
        )
    kept = record_steps(job_dir)
    if step not in kept:
        if not keep.get("replay_keep_steps"):
            why = "the run kept no replay records (trainer.replay_keep_steps is 0; set it, e.g. 20)"
        else:
            cap = f", replay_keep_bytes={keep['replay_keep_bytes']}" if keep.get("replay_keep_bytes") else ""
            why = (
                f"step {step} is past the replay retention: records are kept for {_span(kept)} "
                f"(trainer.replay_keep_steps={keep['replay_keep_steps']}{cap}; raise it to keep more)"
            )
        raise ReplayError(why)
    bases = [0, *_checkpoint_steps(job_dir, durable)]
    covered = [b for b in bases if b < step and all(s in kept for s in range(b + 1, step + 1))]
    if not covered:
        raise ReplayError(
            f"no saved state precedes step {step} within the retention: the checkpoints before it are "
            f"{[b for b in bases if 0 < b < step] or 'none'} and records are kept for {_span(kept)}; a "
            f"replay needs a checkpoint at step {step - 1} or the records of every step after one"
        )
    base = max(covered)
    records = []
    for s in range(base + 1, step + 1):
        record = read_record(job_dir, s)
        assert record is not None
        if record.uids != lineage[s].uids:
            raise ReplayError(
                f"the record of step {s} holds another batch than the lineage of {latest.name} names "
                f"(lease {record.lease_id} vs {lineage[s].lease_id}): it is from a step trained again"
            )
        records.append(record)
    return base, records


def _close(a: float, b: float, tol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b if tol == 0 else abs(a - b) <= tol * (1.0 + abs(b))


def compare_metrics(
    recorded: dict[str, float], replayed: dict[str, float], tol: float, out: StepReplay
) -> None:
    """Every recorded metric but the wall-clock ones against the replayed value, into `out`."""
    for name, was in recorded.items():
        if name.startswith(UNCOMPARED):
            continue
        out.metrics_compared += 1
        now = float(replayed.get(name, math.nan))
        if not _close(was, now, tol):
            out.metrics_differing[name] = (was, now)


def compare_weights(
    job_dir: Path, record: StepRecord, replayed: dict[str, torch.Tensor], tol: float, out: StepReplay
) -> None:
    """The replayed weights against the record's digest (and against the checkpoint of the step when
    it is on disk: max abs diff); the first tensor that differs goes into `out`."""
    from safetensors import safe_open

    digest = tensor_digests(replayed.items())
    saved = job_dir / f"global_step_{record.step}" / "actor" / "model.safetensors"
    with contextlib.ExitStack() as stack:
        ckpt = stack.enter_context(safe_open(str(saved), framework="pt")) if saved.is_file() else None
        names = set(ckpt.keys()) if ckpt is not None else set()
        out.tensors = len(record.weights)
        for name, (hash_was, sum_was, norm_was) in record.weights.items():
            now = digest.get(name)
            if now is None:
                out.first_tensor, out.tensor_detail = name, " (missing from the replayed model)"
                return
            if tol == 0:
                same = now[0] == hash_was
            else:
                same = _close(now[1], sum_was, tol) and _close(now[2], norm_was, tol)
            diff = None
            if name in names:
                ref = ckpt.get_tensor(name).to(torch.float64)
                diff = float((replayed[name].to(torch.float64) - ref).abs().max()) if ref.numel() else 0.0
                same = same and diff <= tol
            if not same:
                out.first_tensor, out.max_abs_diff = name, diff
                out.tensor_detail = (
                    f" (sum {now[1]!r} vs recorded {sum_was!r}, norm {now[2]!r} vs {norm_was!r})"
                )
                return


def replay_steps(job_dir: Path, steps: list[int], tolerance: float | None = None) -> list[StepReplay]:
    """Replay each of `steps` (see the module docstring); raises `ReplayError` before any training
    when one of them cannot be replayed."""
    from services.common.app import load_service_plugins
    from services.common.config import load_config

    job_dir = Path(job_dir)
    config = load_config(job_dir / "config.yaml")
    load_service_plugins(config, str(job_dir / "config.yaml"))  # a plug-in loss trains as in the run
    tr = config.trainer
    if tr.nproc * tr.nnodes > 1:
        raise ReplayError(
            f"the run trained with {tr.nproc * tr.nnodes} ranks (trainer.nproc x nnodes); replay of a "
            "multi-rank run is not supported yet (it replays runs trained by one process)"
        )
    keep = {"replay_keep_steps": tr.replay_keep_steps, "replay_keep_bytes": tr.replay_keep_bytes}
    plans = [(s, *plan_replay(job_dir, s, keep)) for s in steps]

    from services.trainer.collate import collate
    from services.trainer.distributed import ensure_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings

    settings = dataclasses.replace(
        TrainerSettings.from_config(config), job_dir=job_dir, resume=False, replay_keep_steps=0
    )
    info = ensure_process_group()
    tol = (1e-3 if info.device.type == "cuda" else 0.0) if tolerance is None else tolerance
    results = []
    engine: FSDPEngine | None = None
    for step, base, records in plans:
        if engine is None or base == 0:  # the initial model: a fresh engine (seeded as the run's was)
            engine = FSDPEngine(settings, info)
        if base > 0:
            engine.load_checkpoint(str(job_dir / f"global_step_{base}"))
        for record in records:
            out = StepReplay(record.step, base)
            if record.threads:  # a CPU reduction's order depends on the thread count: the run's
                torch.set_num_threads(record.threads)
            metrics = engine.train_step(collate(record.experiences(), engine.pad_token_id))
            compare_weights(job_dir, record, dict(engine.iter_state_dict()), tol, out)
            compare_metrics(record.metrics, metrics, tol, out)
            if not out.ok or record.step == step:
                out.step = record.step
                results.append(out)
                break
    return results


def main(argv: list[str] | None = None) -> int:
    """`python -m services.trainer.replay JOB_DIR --step N [--step M] [--tolerance T] [--json]`, which
    `rft replay` runs: one line block (or JSON object) per step; exit 0 all match, 1 one differs, 2 a step
    cannot be replayed."""
    import argparse
    import json
    import sys

    from services.common.config import ConfigError
    from services.common.plugins import PluginError

    parser = argparse.ArgumentParser(prog="rft replay")
    parser.add_argument("job_dir", type=Path)
    parser.add_argument("--step", "-s", type=int, action="append", required=True)
    parser.add_argument("--tolerance", type=float, default=None)
    parser.add_argument("--json", dest="json_out", action="store_true")
    args = parser.parse_args(argv)
    if not args.job_dir.is_dir():
        print(f"{args.job_dir}: no such job folder", file=sys.stderr)
        return 2
    try:
        results = replay_steps(args.job_dir, sorted(set(args.step)), args.tolerance)
    except (ReplayError, ConfigError, PluginError) as exc:
        print(f"rft replay: {exc}", file=sys.stderr)
        return 2
    for result in results:
        print(json.dumps(result.as_dict()) if args.json_out else "\n".join(result.lines()))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
