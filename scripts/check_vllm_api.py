"""Checks the `vllm` rollout engine against the pinned vLLM release, statically (vLLM has no CPU build).

The wheel of the version `pyproject.toml`'s `vllm` extra names is fetched once with `pip download` into
~/.cache/rft/wheels/ ($RFT_WHEEL_CACHE; `--wheel` takes a local one) and read as a zip; its sources are
parsed with `ast`, never imported. Our modules that use vLLM (and the worker extension they name) are
walked with a small static evaluator, and every use whose target resolves is checked: imported names,
attributes read on vLLM modules, classes and instances, positional counts, required arguments, keyword
arguments (a parameter, a dataclass / msgspec.Struct field, or `**kwargs`, followed where it is
forwarded, as `LLM(**kwargs)` -> `EngineArgs`), string literals given to a `Literal` field, return types
followed into `await` / `async for` / `for`, `collective_rpc` method names and arity against the worker
extension, the extension's names against vLLM's CUDA worker (vLLM asserts they do not clash) and
`model_runner.model.load_weights(...)` against every vLLM model class.
Beyond names, behaviour rules (vllm_api_rules.py, each resting on a premise about vLLM's source that is
checked too): `SamplingParams` with n > 1 asks for FINAL_ONLY outputs; `collective_rpc` arguments are
plain values (msgpack keeps them); `logprobs_mode` is the trainer's definition; sleep mode is used when
enabled; the worker extension loads weights with vLLM's post-load processing or refuses quantized models;
every `VLLM_*` environment variable we name is one vLLM reads (vllm/envs.py; the V1 model runner pin).

Usage: python scripts/check_vllm_api.py [--wheel PATH] [--cache DIR] [FILE ...]
Exit status: 0 no mismatch, 1 mismatches (each `file:line: vLLM symbol: what is missing`), 2 no wheel.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_api_index import VllmIndex
from vllm_api_rules import (  # noqa: E402
    check_call_rules,
    check_env_names,
    check_post_load,
    check_premises,
    check_rpc_payloads,
    check_sleep_rule,
)
from vllm_api_values import Sig  # noqa: E402
from vllm_api_walk import OurModule  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def default_cache() -> Path:
    """Where downloaded wheels are kept between runs ($RFT_WHEEL_CACHE, else ~/.cache/rft/wheels)."""
    return Path(os.environ.get("RFT_WHEEL_CACHE") or Path.home() / ".cache" / "rft" / "wheels").expanduser()


class WheelUnavailable(RuntimeError):
    """The pinned wheel could not be downloaded (no network, no pip, no wheel for this platform)."""


def pinned_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The version in the `vllm` optional extra (`vllm>=0.33` -> "0.33", the release checked against)."""
    extras = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    for spec in extras.get("vllm", []):
        m = re.fullmatch(r"\s*vllm\s*(?:==|>=|~=)\s*([0-9][0-9A-Za-z.]*)\s*(?:,.*)?", spec)
        if m:
            return m.group(1)
    raise SystemExit(f"{pyproject}: [project.optional-dependencies] vllm has no `vllm>=X` or `vllm==X` pin")


def _same_version(a: str, b: str) -> bool:
    def norm(v: str) -> list[str]:
        parts = v.split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return parts

    return norm(a) == norm(b)


def fetch_wheel(version: str, cache: Path) -> tuple[Path, float]:
    """The cached wheel of vllm `version`, downloaded first if absent; returns (path, download seconds)."""
    cache.mkdir(parents=True, exist_ok=True)
    for whl in sorted(cache.glob("vllm-*.whl")):
        if _same_version(whl.name.split("-")[1], version):
            return whl, 0.0
    pip = [sys.executable, "-m", "pip"] if _has_pip() else [shutil.which("pip3") or shutil.which("pip") or ""]
    if not pip[0]:
        raise WheelUnavailable("no pip found to download the vllm wheel (install pip or pass --wheel)")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [*pip, "download", "--no-deps", "--only-binary=:all:", f"vllm=={version}", "-d", tmp]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise WheelUnavailable(f"`{' '.join(cmd)}` took over 900 s") from exc
        seconds = time.perf_counter() - t0
        got = list(Path(tmp).glob("vllm-*.whl"))
        if done.returncode != 0 or not got:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise WheelUnavailable(f"`{' '.join(cmd)}` failed: {' / '.join(tail)}")
        target = cache / got[0].name
        os.replace(got[0], target)
    return target, seconds


def _has_pip() -> bool:
    import importlib.util

    return importlib.util.find_spec("pip") is not None


@dataclass
class Mismatch:
    path: str
    line: int
    symbol: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.symbol}: {self.problem}"


@dataclass
class Report:
    mismatches: list[Mismatch] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    quiet: bool = False
    modules: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # what one call shows for a rule on the whole (sleep mode)

    def ok(self, path: str, line: int, what: str) -> None:
        if not self.quiet:
            self.checked.append(f"{path}:{line}: {what}")

    def bad(self, path: str, line: int, symbol: str, problem: str) -> None:
        if not self.quiet:
            self.mismatches.append(Mismatch(path, line, symbol, problem))


def _suggest(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_call(idx: VllmIndex, rep: Report, where: tuple[str, int], sig: Sig, call: ast.Call) -> None:
    """Positional count and each keyword (and a string literal given to a `Literal` field) of `call`."""
    path, line = where
    npos = sum(1 for a in call.args if not isinstance(a, ast.Starred))
    if (
        not any(isinstance(a, ast.Starred) for a in call.args)
        and not sig.varargs
        and npos > len(sig.positional)
    ):
        rep.bad(path, line, sig.qual, f"takes {len(sig.positional)} positional argument(s), {npos} given")
    unpacked = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
    given = set(sig.positional[:npos]) | {k.arg for k in call.keywords}
    missing = [r for r in sig.required if r not in given]
    if missing and not unpacked:
        rep.bad(path, line, sig.qual, f"missing required argument(s) {', '.join(map(repr, missing))}")
    for kw in call.keywords:
        if kw.arg is None:
            continue
        found = idx.accepts(sig, kw.arg)
        if found is None:
            names = [*sig.positional, *sig.keyword]
            rep.bad(path, line, sig.qual, f"no parameter or field {kw.arg!r}{_suggest(kw.arg, names)}")
            continue
        allowed = idx.literal_values(found) if isinstance(kw.value, ast.Constant) else None
        if allowed is not None and isinstance(kw.value.value, str) and kw.value.value not in allowed:
            rep.bad(path, line, sig.qual, f"{kw.arg}={kw.value.value!r} is not one of {sorted(allowed)}")
        else:
            rep.ok(path, line, f"{sig.qual}({kw.arg}=...)")
    check_call_rules(idx, rep, where, sig, call, rep.facts)


def vllm_users(root: Path = ROOT) -> list[Path]:
    """Our modules under services/ that import vllm."""
    out = []
    for p in sorted((root / "services").rglob("*.py")):
        text = p.read_text()
        if "vllm" in text and re.search(r"^\s*(import vllm|from vllm[\s.])", text, re.M):
            out.append(p)
    return out


def check_files(idx: VllmIndex, files: list[Path], root: Path = ROOT) -> Report:
    """Every vLLM use in `files` plus the worker extension modules they name."""
    rep = Report()
    todo = [(p, None) for p in files]
    extensions: dict[str, str] = {}  # module path -> class name
    rpcs = []
    mods: list[OurModule] = []
    while todo:
        path, ext_cls = todo.pop(0)
        rel = os.path.relpath(path, root)
        mod = OurModule(idx, rep, rel, path.read_text(), check_call)
        mod.run(extension=ext_cls)
        mods.append(mod)
        rpcs += mod.rpcs
        for dotted, line in mod.extensions:
            modname, _, cls = dotted.rpartition(".")
            file = root / (modname.replace(".", "/") + ".py")
            if not file.exists():
                rep.bad(rel, line, "worker_extension_cls", f"{dotted!r}: no module file {file}")
            elif str(file) not in extensions:
                extensions[str(file)] = cls
                todo.append((file, cls))
    ext_methods = {name: sig for m in mods for name, sig in m.extension_methods.items()}
    for path, line, method, call in rpcs:
        sig = ext_methods.get(method) or idx.method_sig(method)
        if sig is None:
            known = sorted(ext_methods)
            rep.bad(path, line, "collective_rpc", f"no worker method {method!r}{_suggest(method, known)}")
        else:
            n = len(rep.mismatches)
            check_call(idx, rep, (path, line), sig, call)
            if len(rep.mismatches) == n:
                rep.ok(path, line, f"collective_rpc({method!r}) -> {sig.qual}, {len(call.args)} argument(s)")
    for m in mods:
        check_rpc_payloads(rep, m.path, m.tree, root)
        check_env_names(idx, rep, m.path, m.tree)
        for c in m.classes.values():
            if c.extension:
                check_post_load(rep, m.path, c.node)
    check_sleep_rule(rep, rep.facts)
    check_premises(idx, rep)
    rep.modules = [m.path for m in mods]
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="modules to check (default: services/ users of vllm)")
    ap.add_argument("--wheel", type=Path, help="a local vllm wheel instead of downloading the pinned one")
    ap.add_argument("--cache", type=Path, default=default_cache(), help="wheel cache (default %(default)s)")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every use checked")
    args = ap.parse_args(argv)
    version = pinned_version()
    try:
        wheel, seconds = (args.wheel, 0.0) if args.wheel else fetch_wheel(version, args.cache)
    except WheelUnavailable as exc:
        print(f"cannot check the vLLM API: {exc}", file=sys.stderr)
        return 2
    idx = VllmIndex(wheel)
    size = wheel.stat().st_size / 2**20
    got = f"downloaded in {seconds:.1f} s" if seconds else "cached"
    print(f"vLLM {idx.version} (pinned {version}): {wheel} ({size:.0f} MiB, {got})")
    files = [f.resolve() for f in args.files] or vllm_users()
    rep = check_files(idx, files)
    if args.verbose:
        print("\n".join(f"  ok  {c}" for c in rep.checked))
    for m in rep.mismatches:
        print(f"  MISMATCH  {m}")
    print(
        f"{len(rep.checked)} uses checked in {', '.join(rep.modules)}: {len(rep.mismatches)} mismatch(es)"
        + ("" if args.verbose else " (-v lists them)")
    )
    return 1 if rep.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
