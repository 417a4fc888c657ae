"""The static checks of `scripts/gpu_probe.sh --dry-run`, runnable on any machine (no GPU, no network).

    python scripts/gpu_probe_check.py plan                 # planned seconds per step, their sum < 480
    python scripts/gpu_probe_check.py tests                # each pytest target holds gpu-marked tests
    python scripts/gpu_probe_check.py benches              # each bench takes the options the probe passes
    python scripts/gpu_probe_check.py imports [--dest D]   # what the steps import travels or is in the image
    python scripts/gpu_probe_check.py image [--dest D]     # the carried set holds nothing the image has

The plan is read from `bash scripts/gpu_probe.sh --list` (one line per step: name, planned seconds,
command), so the script stays the one place it is written.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN_LIMIT_S = 480
_spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "scripts" / "gpu_wheels.py")
gpu_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_wheels)

# What the steps import: the services `rft run` starts, the benches and the test support they use.
# Test modules come from the plan's pytest targets; trl/datasets are checked by the offline install only
# when this python lacks them (they live in the benchmark's own venv here).
MODULES = [
    "launcher.cli", "services.trainer.service", "services.explorer.service", "services.buffer.service",
    "services.synchronizer.service", "services.trainer.engine", "tests.support.trainer_data",
    "tests.support.rft_run", "pytest", "pytest_asyncio", "pytest_timeout", "hypothesis", "yaml",
]  # fmt: skip
BENCH_MODULES = ["trainer_step", "gpu_quickstart", "e2e_vs_trl", "rft_runs", "quickstart_seeds"]
OPTIONAL = ["trl", "datasets"]


def plan() -> list[tuple[str, int, str]]:
    """(step, planned seconds, command) from `gpu_probe.sh --list`."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_probe.sh"), "--list"], capture_output=True, text=True, check=True
    ).stdout
    rows = []
    for line in out.splitlines():
        name, planned, command = line.split("\t", 2)
        rows.append((name, int(planned), command))
    return rows


def pytest_targets(command: str) -> list[str]:
    """The test files a step's `pytest` command names."""
    return [w for w in shlex.split(command) if w.startswith("tests/") and w.endswith(".py")]


def check_plan() -> int:
    rows = plan()
    total = sum(p for _, p, _ in rows)
    for name, planned, command in rows:
        print(f"  {name:14s} {planned:4d} s  {command}")
    ok = total < PLAN_LIMIT_S
    print(f"[gpu-probe] planned total {total} s ({'<' if ok else 'NOT <'} {PLAN_LIMIT_S})")
    return 0 if ok else 1


def collected(files: list[str]) -> dict[str, int]:
    """gpu-marked tests per file, by `pytest --collect-only -m gpu`."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu", *files],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    counts = dict.fromkeys(files, 0)
    for line in proc.stdout.splitlines():
        path = line.split("::", 1)[0]
        if "::" in line and path in counts:
            counts[path] += 1
    return counts


def check_tests() -> int:
    files = [f for _, _, c in plan() for f in pytest_targets(c)]
    counts = collected(files)
    for f, n in counts.items():
        print(f"  {f}: {n} gpu-marked tests")
    empty = [f for f, n in counts.items() if n == 0]
    if empty:
        print(f"[gpu-probe] no gpu-marked test collected in {empty}", file=sys.stderr)
    return 1 if empty else 0


def check_benches() -> int:
    bad = 0
    for name, _, command in plan():
        words = shlex.split(command)
        for i, w in enumerate(words):
            if not (w.startswith("bench/") and w.endswith(".py")):
                continue
            opts = {o.split("=")[0] for o in words[i + 1 :] if o.startswith("--")}
            helptext = subprocess.run(
                [sys.executable, w, "--help"], cwd=ROOT, capture_output=True, text=True
            ).stdout
            missing = sorted(o for o in opts if o not in helptext)
            print(
                f"  {name}: {w} {'takes ' + ' '.join(sorted(opts)) if not missing else 'LACKS ' + ' '.join(missing)}"
            )
            bad += bool(missing) or not helptext
    return 1 if bad else 0


def carried(dest: Path) -> set[str]:
    lines = (dest / "requirements.txt").read_text().splitlines()
    return {gpu_wheels.canonicalize_name(x.split("==")[0]) for x in lines if x.strip()}


def check_image(dest: Path) -> int:
    both = sorted(n for n in carried(dest) if gpu_wheels.provided(n))
    if both:
        print(f"[gpu-probe] carried although the GPU image has them: {both}", file=sys.stderr)
        return 1
    over = ", ".join(gpu_wheels.CARRIED_OVER_IMAGE)
    print(
        f"[gpu-probe] the carried set holds nothing the image provides (carried over it on purpose: {over})"
    )
    return 0


def check_imports(dest: Path) -> int:
    """Import what the steps import here, then map every loaded module to its distribution: each must
    travel (dest's requirements.txt), be provided by the image, or be the project / the standard library."""
    sys.path[:0] = [str(ROOT), str(ROOT / "protos"), str(ROOT / "bench")]
    tests = [f[:-3].replace("/", ".") for _, _, c in plan() for f in pytest_targets(c)]
    for mod in MODULES + BENCH_MODULES + tests:
        importlib.import_module(mod)
    for mod in OPTIONAL:
        try:
            importlib.import_module(mod)
        except ImportError:
            print(f"  {mod}: not in this python; its closure is checked from the wheels' METADATA")
    dists = importlib.metadata.packages_distributions()
    have = carried(dest)
    needed: set[str] = set()
    for name in list(sys.modules):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top.startswith("_") or top not in dists:
            continue
        needed |= {gpu_wheels.canonicalize_name(d) for d in dists[top]}
    project = gpu_wheels.canonicalize_name("rft-mesh")
    absent = sorted(d for d in needed if d != project and d not in have and not gpu_wheels.provided(d))
    # A package imported here but required by nothing that travels was imported because this venv has it
    # (an optional import: uvicorn's watchfiles, hub's opentelemetry...): listed, not an error. A declared
    # requirement of the project that neither travels nor is in the image is one.
    declared = set(gpu_wheels.top_level()) | {gpu_wheels.canonicalize_name(n) for n in gpu_wheels.EXTRA_ROOTS}
    project_reqs = [
        r.split(";")[0] for r in importlib.metadata.requires("rft-mesh") or [] if "extra ==" not in r
    ]
    declared |= {
        gpu_wheels.canonicalize_name(re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0]) for r in project_reqs
    }
    errors = [d for d in absent if d in declared and d not in gpu_wheels.NOT_NEEDED]
    print(f"  {len(needed)} distributions imported: {len([d for d in needed if d in have])} travel, "
          f"{len([d for d in needed if gpu_wheels.provided(d)])} in the image")  # fmt: skip
    if absent:
        print(
            f"  optional imports of this venv (no requirement of what travels): {[d for d in absent if d not in errors]}"
        )
    if errors:
        print(
            f"[gpu-probe] required by the project, neither carried nor in the image: {errors}",
            file=sys.stderr,
        )
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("check", choices=["plan", "tests", "benches", "imports", "image"])
    ap.add_argument("--dest", type=Path, default=ROOT / ".gpu-wheels")
    args = ap.parse_args()
    if args.check in ("imports", "image") and not (args.dest / "requirements.txt").is_file():
        print(f"{args.dest}/requirements.txt is missing: run `bash scripts/gpu_wheels.sh`", file=sys.stderr)
        return 1
    checks = {
        "plan": check_plan, "tests": check_tests, "benches": check_benches,
        "imports": lambda: check_imports(args.dest), "image": lambda: check_image(args.dest),
    }  # fmt: skip
    return checks[args.check]()


if __name__ == "__main__":
    sys.exit(main())
