"""Chaos campaign: SIGKILL the services of real `rft run`s on a real redis-server, then audit.

Each campaign is one Redis-store GRPO run on the tiny model (strictly on-policy, `save_interval` 4)
with `--per-run` kills at seeded random moments, spread over buffer, trainer, explorer and
synchronizer; `rft run` restarts each killed service in place. After the run, the final checkpoint's
lineage is compared with the buffer's accepted log (`rft audit`). Campaigns repeat until `--kills`
kills are done. The baseline is the same run with no kill, measured in the same invocation.

Printed: per campaign the kills (service, trainer step, delay, seconds until training resumed) and the
audit; then the totals. The last line is one JSON object: produced, trained_once, trained_twice, lost,
remaining, restarts_completed, resume_s (median and max), wall times; "ratio" = experiences trained
exactly once / experiences the runs needed (produced - remaining), "target" 1.0.

    python bench/chaos.py [--kills 20] [--per-run 5] [--steps 60] [--seed 1] [--quick]

Nemesis mode (`--nemesis N`): N faults of eight kinds mixed at random over runs of `--steps` steps
(`--per-run` each; tests/support/nemesis.py): SIGKILL, a pause (SIGSTOP for 2-5 s), a hang (SIGSTOP never
resumed, found by `services.liveness_timeout` 8 s), the buffer's Redis link cut both ways (5-12 s), one way
(5-10 s) or slowed to 0.5 s per chunk (5-10 s), Redis's disk filled until it cannot write and stops
(2-6 s full, then freed and Redis started again), and the job folder's disk filled (4-8 s: checkpoints,
logs and metrics fail to write); the disk faults need root to mount small disks, else they are left out
with a line saying so. Printed per fault kind: injected, survived (training went
on after it), recovery time from the fault's end to the next trainer step (median, max); per run the
audit. The JSON line adds "by_kind"; "ratio" is as above.

    python bench/chaos.py --nemesis 30 [--per-run 6] [--steps 60] [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

from launcher.audit import audit_job  # noqa: E402
from tests.support.chaos import Campaign, run_campaign, schedule, write_chaos_config  # noqa: E402
from tests.support.nemesis import DISK_KINDS, KINDS, Fault, nemesis_schedule, run_nemesis  # noqa: E402
from tests.support.redis_server import RedisServer, find_redis_server, free_port  # noqa: E402
from tests.support.small_disk import SmallDisk  # noqa: E402


def campaign(redis_url: str, kills: int, steps: int, seed: int) -> Campaign:
    with tempfile.TemporaryDirectory(prefix="rft-chaos-") as tmp:
        root = Path(tmp)
        config, job = write_chaos_config(
            root, redis_url, total_steps=steps, save_interval=4, prefix=f"chaos-{uuid.uuid4().hex[:6]}"
        )
        plan = schedule(seed, kills, steps) if kills else []
        result = run_campaign(config, job, plan, root / "rft.log", timeout_s=900)
        if result.returncode != 0:
            print(result.log[-4000:], file=sys.stderr)
        return result


def nemesis(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="rft-nemesis-disk-") as tmp, \
            SmallDisk.mount(Path(tmp) / "redis", "256m") as disk:  # fmt: skip
        if disk is None:
            print(f"no small disk can be mounted ({SmallDisk.why_not}): the disk faults are left out", flush=True)
            kinds, directory = KINDS, Path(tmp)
        else:
            kinds, directory = KINDS + DISK_KINDS, disk.path
        server = RedisServer(
            port=free_port(), directory=directory, appendonly=True, binary=find_redis_server()
        )
        server.launch()
        try:
            faults, audits, walls, codes = _nemesis_runs(args, server, kinds)
        finally:
            server.stop()
    _nemesis_report(args, faults, audits, walls, codes)


@contextlib.contextmanager
def _none():
    yield None


def _nemesis_runs(args: argparse.Namespace, server: RedisServer, kinds: tuple[str, ...]):
    faults: list[Fault] = []
    audits, walls, codes = [], [], []
    while len(faults) < args.nemesis:
        n = min(args.per_run, args.nemesis - len(faults))
        plan = nemesis_schedule(args.seed + len(walls), n, args.steps, kinds)
        with tempfile.TemporaryDirectory(prefix="rft-nemesis-") as tmp, \
                SmallDisk.mount(Path(tmp) / "ckpt", "256m") if "job_disk" in kinds else _none() as job_disk:  # fmt: skip
            if "job_disk" in kinds and job_disk is None:
                raise SystemExit(f"the job folder's disk cannot be mounted: {SmallDisk.why_not}")
            code, wall, job, log = run_nemesis(
                Path(tmp), server, plan, args.steps, f"nem-{uuid.uuid4().hex[:6]}", timeout_s=900
            )
            audit = audit_job(job, redis_url=server.url)
        if code != 0:
            print(log[-4000:], file=sys.stderr)
        faults += plan
        audits.append(audit)
        walls.append(wall)
        codes.append(code)
        print(f"run {len(walls)}: exit {code}, {wall:.1f}s, audit {audit.as_dict()}", flush=True)
        for f in plan:
            print(f"  {f.kind:<10} {f.service:<12} after step {f.after_step:>3} hold {f.hold_s:>4.1f}s"
                  f" -> training went on {f.recovery_s}s after its end", flush=True)  # fmt: skip
    return faults, audits, walls, codes


def _nemesis_report(args: argparse.Namespace, faults: list[Fault], audits, walls, codes) -> None:
    by_kind = {}
    for kind in sorted({f.kind for f in faults}):
        these = [f for f in faults if f.kind == kind]
        rec = [f.recovery_s for f in these if f.recovery_s is not None]
        by_kind[kind] = {
            "injected": len(these),
            "survived": len(rec),
            "recovery_s_median": round(statistics.median(rec), 2) if rec else None,
            "recovery_s_max": max(rec) if rec else None,
        }
        print(f"{kind:<10} injected {len(these):>3}  survived {len(rec):>3}  recovery median "
              f"{by_kind[kind]['recovery_s_median']} s, max {by_kind[kind]['recovery_s_max']} s")  # fmt: skip
    total = {
        key: sum(getattr(a, key) or 0 for a in audits)
        for key in ("produced", "trained_once", "trained_twice", "lost", "remaining", "unknown")
    }
    needed = total["produced"] - total["remaining"]
    print(json.dumps({
        "bench": "chaos_nemesis", "faults": len(faults), "runs": len(walls),
        "runs_completed": sum(1 for c in codes if c == 0), "steps_per_run": args.steps, **total,
        "by_kind": by_kind, "wall_s_per_run": round(statistics.median(walls), 1),
        "ratio": round(total["trained_once"] / needed, 4) if needed else 0.0, "target": 1.0,
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--per-run", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="4 kills in one run")
    parser.add_argument("--nemesis", type=int, default=0, help="N mixed faults instead of kills")
    args = parser.parse_args()
    if args.nemesis:
        return nemesis(args)
    if args.quick:
        args.kills, args.per_run = 4, 4
    with RedisServer.start(appendonly=True) as server:
        base = campaign(server.url, 0, args.steps, args.seed)
        print(f"baseline (no kill): {base.wall_s:.1f}s, audit {base.audit.as_dict()}", flush=True)
        runs: list[Campaign] = []
        done = 0
        while done < args.kills:
            k = min(args.per_run, args.kills - done)
            result = campaign(server.url, k, args.steps, args.seed + len(runs))
            runs.append(result)
            done += k
            print(f"campaign {len(runs)}: exit {result.returncode}, {result.wall_s:.1f}s", flush=True)
            for kill in result.kills:
                print(f"  kill {kill.service:<12} after step {kill.after_step:>3} +{kill.delay_s:.2f}s"
                      f"  -> training resumed after {kill.resume_s}s", flush=True)  # fmt: skip
            print(f"  audit: {result.audit.as_dict()}", flush=True)
    audits = [r.audit for r in runs]
    resumes = [k.resume_s for r in runs for k in r.kills if k.resume_s is not None]
    total = {
        key: sum(getattr(a, key) or 0 for a in audits)
        for key in ("produced", "trained_once", "trained_twice", "lost", "remaining", "unknown")
    }
    by_service: dict[str, int] = {}
    for r in runs:
        for kill in r.kills:
            by_service[kill.service] = by_service.get(kill.service, 0) + 1
    needed = total["produced"] - total["remaining"]
    out = {
        "bench": "chaos",
        "kills": done,
        "kills_by_service": by_service,
        "runs": len(runs),
        "runs_completed": sum(1 for r in runs if r.returncode == 0),
        "steps_per_run": args.steps,
        **total,
        "restarts_completed": sum(r.restarts_completed for r in runs),
        "resume_s_median": round(statistics.median(resumes), 2) if resumes else None,
        "resume_s_max": max(resumes) if resumes else None,
        "wall_s_per_run": round(statistics.median(r.wall_s for r in runs), 1),
        "baseline_wall_s": round(base.wall_s, 1),
        "ratio": round(total["trained_once"] / needed, 4) if needed else 0.0,
        "target": 1.0,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
