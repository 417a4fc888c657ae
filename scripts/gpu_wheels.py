"""The wheel set the offline GPU check installs: which packages, fetched here, verified before it travels.

    python scripts/gpu_wheels.py download [--dest .gpu-wheels]   # needs PyPI (run by scripts/gpu_wheels.sh)
    python scripts/gpu_wheels.py check [--dest .gpu-wheels]      # offline: is the folder complete?

The GPU machine (scripts/gpu_check.sh) has python 3.12 and a CUDA build of torch but no network, so every
other package the check imports travels in `.gpu-wheels/` as cp312 manylinux x86_64 wheels.

Which packages: the project's runtime and `dev` dependencies from pyproject.toml, less torch (and its CUDA
family: nvidia-*, triton, which the machine has) and less `NOT_NEEDED`: packages the GPU check never imports
(data loading, plotting, the serve endpoint, lint, proto generation), which would make the folder several
times larger (pyarrow alone is a 55 MB wheel). Versions are the pins of requirements/constraints.txt, the
versions the test suite runs with. Their dependencies are added by reading each downloaded wheel's own
METADATA (markers evaluated for CPython 3.12 on Linux x86_64) until the set is closed, so the closure is
the one of the very wheels that travel. `.gpu-wheels/requirements.txt` lists the result, pinned.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
# Provided by the GPU machine's system-wide CUDA torch install: never downloaded.
SYSTEM = re.compile(r"^(torch|triton|nvidia-.*)$")
# Not imported by anything the GPU check runs (pytest -m gpu files, bench/rollout.py, bench/trainer_step.py,
# the one-GPU quickstart of bench/gpu_quickstart.py: its jsonl data reads without `datasets`, see
# services/common/json_rows.py, and `rft run` draws no curves without matplotlib). fastapi and uvicorn
# travel: the explorer imports its OpenAI-compatible endpoint's app at start. cryptography only makes the
# TLS tests' certificates.
NOT_NEEDED = {
    "datasets",
    "pyarrow",
    "matplotlib",
    "math-verify",
    "openai",
    "ruff",
    "grpcio-tools",
    "cryptography",
    "hf-xet",  # hub downloads (Xet storage); the check makes its models locally
}
# pip of this interpreter, else of the system python3 (a uv-made venv has no pip of its own)
PIP = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else ["python3", "-m", "pip"]
# The editable install of the project builds with these (pyproject.toml [build-system]).
BUILD = ["setuptools", "wheel"]
PLATFORM_ARGS = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux_2_28_x86_64",
]  # fmt: skip
TARGET_ENV = {
    **default_environment(),
    "python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "os_name": "posix",
}  # fmt: skip


def top_level() -> list[str]:
    """Canonical names of the project's runtime + dev requirements the GPU check needs, plus BUILD."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [Requirement(r).name for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    keep = [canonicalize_name(n) for n in names + BUILD]
    return sorted({n for n in keep if not SYSTEM.match(n) and n not in NOT_NEEDED})


def pins() -> dict[str, str]:
    """name -> version from requirements/constraints.txt."""
    out = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonicalize_name(name)] = version.strip()
    return out


def wheels(dest: Path) -> dict[str, tuple[str, Path]]:
    """name -> (version, file) of the wheels in `dest`."""
    out = {}
    for f in sorted(dest.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(f.name)
        out[canonicalize_name(name)] = (str(version), f)
    return out


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    """The wheel's Requires-Dist that apply on the target (CPython 3.12, Linux x86_64) with `extras`."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        envs = [{**TARGET_ENV, "extra": e} for e in sorted(extras)] or [{**TARGET_ENV, "extra": ""}]
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            out.append(req)
    return out


def missing(dest: Path, roots: list[str]) -> tuple[list[str], list[str]]:
    """(names needed but absent, version conflicts) for the closure of `roots` over the wheels in `dest`."""
    have = wheels(dest)
    absent, conflicts, seen = set(), [], set()
    todo: list[tuple[str, set[str]]] = [(n, set()) for n in roots]
    while todo:
        name, extras = todo.pop()
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        if name not in have:
            absent.add(name)
            continue
        version, path = have[name]
        for req in requires(path, extras):
            dep = canonicalize_name(req.name)
            if SYSTEM.match(dep) or dep in NOT_NEEDED:
                continue
            if dep in have and not req.specifier.contains(have[dep][0], prereleases=True):
                conflicts.append(f"{name}=={version} needs {req}, the folder has {dep}=={have[dep][0]}")
            todo.append((dep, set(req.extras)))
    return sorted(absent), conflicts


def download(final: Path) -> int:
    """Fill `final` anew (a new folder, swapped in on success: no wheel of an older pin stays behind)."""
    pinned = pins()
    roots = top_level()
    dest = final.with_name(final.name + ".partial")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    todo = roots
    while todo:
        unpinned = [n for n in todo if n not in pinned and n not in BUILD]
        if unpinned:
            print(f"no pin in requirements/constraints.txt for {unpinned}: add them there", file=sys.stderr)
            return 1
        specs = [f"{n}=={pinned[n]}" if n in pinned else n for n in todo]
        print("[gpu-wheels] downloading", " ".join(specs), flush=True)
        cmd = [*PIP, "download", "-qq", "--no-deps", *PLATFORM_ARGS, "-d", str(dest)]
        subprocess.run([*cmd, *specs], check=True)
        todo, conflicts = missing(dest, roots)
        if conflicts:
            print("\n".join(conflicts), file=sys.stderr)
            return 1
    have = wheels(dest)
    closure = sorted(have)
    (dest / "requirements.txt").write_text("".join(f"{n}=={have[n][0]}\n" for n in closure))
    size = sum(p.stat().st_size for _, p in have.values())
    shutil.rmtree(final, ignore_errors=True)
    dest.rename(final)
    print(f"[gpu-wheels] {len(closure)} wheels, {size / 2**20:.1f} MiB in {final}")
    return 0


def check(dest: Path) -> int:
    """Offline: every root and every dependency of the closure has a consistent wheel in `dest`."""
    if not (dest / "requirements.txt").is_file():
        print(f"{dest}/requirements.txt is missing: run `bash scripts/gpu_wheels.sh` first", file=sys.stderr)
        return 1
    absent, conflicts = missing(dest, top_level())
    for line in [f"no wheel for {n}" for n in absent] + conflicts:
        print(f"[gpu-wheels] {line}", file=sys.stderr)
    if absent or conflicts:
        print("[gpu-wheels] run `bash scripts/gpu_wheels.sh` again", file=sys.stderr)
        return 1
    print(
        f"[gpu-wheels] {dest}: closure of {len(top_level())} requirements complete ({len(wheels(dest))} wheels)"
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["download", "check", "list"])
    ap.add_argument("--dest", type=Path, default=ROOT / ".gpu-wheels")
    args = ap.parse_args()
    if args.action == "list":
        print("\n".join(top_level()))
        return 0
    return download(args.dest) if args.action == "download" else check(args.dest)


if __name__ == "__main__":
    sys.exit(main())
