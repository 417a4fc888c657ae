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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

from tests.support.chaos import Campaign, run_campaign, schedule, write_chaos_config  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--per-run", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="4 kills in one run")
    args = parser.parse_args()
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
