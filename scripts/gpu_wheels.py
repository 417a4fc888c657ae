"""The wheel set the offline GPU probe installs: which packages, fetched here, verified before it travels.

    python scripts/gpu_wheels.py download [--dest .gpu-wheels]   # needs PyPI (run by scripts/gpu_wheels.sh)
    python scripts/gpu_wheels.py check [--dest .gpu-wheels]      # offline: is the folder complete?
    python scripts/gpu_wheels.py list                            # the roots, one per line

The GPU machine (scripts/gpu_probe.sh) has no network; its python3 is a virtualenv holding the packages of
`IMAGE` (torch 2.11 for CUDA 13, transformers 5.17, accelerate, peft, pyarrow, pandas, numpy, safetensors,
tensorboard, triton and what they pull in). Only what it lacks travels in `.gpu-wheels/`, as cp312
manylinux x86_64 wheels: the project's runtime and `dev` dependencies and TRL with `datasets` (the probe's
baseline, bench/trl_grpo_worker.py), less `IMAGE` and less `NOT_NEEDED` (packages no probe step imports).
grpcio and protobuf travel although the image has some version of them: the generated code of protos/
refuses a runtime older than the one it was generated for (`CARRIED_OVER_IMAGE`).
Versions are the pins of requirements/constraints.txt (TRL's: `EXTRA_PINS`), the versions the test suite
runs with. Their dependencies are added by reading each downloaded wheel's own METADATA (markers evaluated
for CPython 3.12 on Linux x86_64) until the set is closed, a dependency the image provides ending the walk
(its version is checked where `IMAGE_VERSIONS` knows it). `.gpu-wheels/requirements.txt` lists the result.
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
# torch's CUDA family: never downloaded (a CPU-only pip could not even resolve it for the machine).
SYSTEM = re.compile(r"^(torch|triton|nvidia-.*)$")
# What the GPU machine's python3 (a virtualenv) holds besides torch: the image's own list (transformers,
# accelerate, peft, pyarrow, pandas, grpcio, protobuf, numpy, safetensors, tensorboard) and the packages
# those require (transformers: huggingface-hub, tokenizers, pyyaml, regex, tqdm, packaging; torch:
# filelock, fsspec, jinja2, markupsafe, networkx, sympy, mpmath, setuptools, typing-extensions;
# accelerate: psutil; pandas: python-dateutil; tensorboard: absl-py, markdown, pillow, werkzeug,
# tensorboard-data-server). Only names that are certain: a name missing here is merely carried twice.
IMAGE = {
    "transformers", "huggingface-hub", "tokenizers", "safetensors", "numpy", "pyyaml", "regex", "tqdm",
    "packaging", "accelerate", "psutil", "peft", "pyarrow", "pandas", "python-dateutil", "grpcio",
    "protobuf", "tensorboard", "tensorboard-data-server", "absl-py", "markdown", "pillow", "werkzeug",
    "filelock", "fsspec", "jinja2", "markupsafe", "networkx", "sympy", "mpmath", "setuptools",
    "typing-extensions",
}  # fmt: skip
# The image's versions where they are known: a carried wheel's requirement on them is checked.
IMAGE_VERSIONS = {"torch": "2.11.0", "transformers": "5.17.0", "triton": "3.6.0"}
# In the image, carried all the same (first on PYTHONPATH, so these win), and why.
CARRIED_OVER_IMAGE = {
    "grpcio": "protos/*_pb2_grpc.py refuse a grpcio older than 1.85.1 (GRPC_GENERATED_VERSION); the image's "
    "may be as old as tensorboard allows (1.74)",
    "protobuf": "protos/*_pb2.py refuse a protobuf runtime older than 7.35.1; tensorboard allows 6.31",
}
# Benchmark-only roots (pyproject's `bench` extra; TRL pulls datasets, dill, multiprocess, xxhash) and their
# pins where requirements/constraints.txt has none (the version bench/e2e_vs_trl.py's venv runs).
EXTRA_ROOTS = ["trl"]
EXTRA_PINS = {"trl": "1.16.0"}
# Not imported by anything the GPU probe runs (the gpu-marked tests it names, bench/gpu_quickstart.py,
# bench/trainer_step.py, bench/e2e_vs_trl.py + bench/trl_grpo_worker.py): jsonl data reads without
# `datasets` in the product (services/common/json_rows.py), `rft run` draws no curves without matplotlib.
# fastapi and uvicorn travel: the explorer imports its OpenAI-compatible endpoint's app at start.
# cryptography only makes the TLS tests' certificates.
NOT_NEEDED = {
    "matplotlib",
    "math-verify",
    "openai",
    "ruff",
    "grpcio-tools",
    "cryptography",
    "hf-xet",  # hub downloads (Xet storage); the probe makes its models locally
}
# pip of this interpreter, else of the system python3 (a uv-made venv has no pip of its own)
PIP = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else ["python3", "-m", "pip"]
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


def provided(name: str) -> bool:
    """True when the GPU machine has `name` and it does not travel."""
    return bool(SYSTEM.match(name)) or (name in IMAGE and name not in CARRIED_OVER_IMAGE)


def top_level() -> list[str]:
    """Canonical names of what travels at the top: the project's runtime + dev requirements and
    EXTRA_ROOTS, less what the image provides and NOT_NEEDED."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [Requirement(r).name for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    keep = [canonicalize_name(n) for n in names + EXTRA_ROOTS] + list(CARRIED_OVER_IMAGE)
    return sorted({n for n in keep if not provided(n) and n not in NOT_NEEDED})


def pins() -> dict[str, str]:
    """name -> version from requirements/constraints.txt."""
    out = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonicalize_name(name)] = version.strip()
    return {**out, **EXTRA_PINS}


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
            if dep in IMAGE_VERSIONS and not req.specifier.contains(IMAGE_VERSIONS[dep], prereleases=True):
                conflicts.append(
                    f"{name}=={version} needs {req}, the GPU image has {dep}=={IMAGE_VERSIONS[dep]}"
                )
            if provided(dep) or dep in NOT_NEEDED:
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
        unpinned = [n for n in todo if n not in pinned]
        if unpinned:
            print(f"no pin in requirements/constraints.txt for {unpinned}: add them there", file=sys.stderr)
            return 1
        specs = [f"{n}=={pinned[n]}" for n in todo]
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
