"""Generate the one Python package of the contracts (`rft.v1`, with .pyi stubs) from protos/rft/v1/*.proto.

Usage: python scripts/gen_protos.py [--check]
The generated modules are written next to the .proto files (protos/rft/v1/*_pb2*.py), so the
package `rft` is importable from the `protos` folder (pyproject maps it). `--check` regenerates
into a temporary folder and exits 1 when the committed files differ (drift check).
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = PROTO_ROOT / "rft" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
INIT_TEXT = (
    '"""Generated gRPC contracts of RFT Mesh (package rft.v1). Do not edit: run scripts/gen_protos.py."""\n'
)


def generate(out_root: Path) -> list[Path]:
    """Compile every proto into `out_root/rft/v1/` and return the generated files."""
    protos = sorted(PACKAGE_DIR.glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    pkg = out_root / "rft" / "v1"
    for init in (out_root / "rft" / "__init__.py", pkg / "__init__.py"):
        init.write_text(INIT_TEXT)
    return sorted(p for p in pkg.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def _committed_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def check() -> int:
    """Return 0 when the committed generated files equal a fresh generation, else print a diff."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        fresh_names = {p.name for p in fresh}
        committed_names = {p.name for p in _committed_files()}
        problems = []
        for name in sorted(fresh_names ^ committed_names):
            where = "missing from protos/rft/v1" if name in fresh_names else "not produced by the protos"
            problems.append(f"{name}: {where}")
        for p in fresh:
            mine = PACKAGE_DIR / p.name
            if mine.exists() and not filecmp.cmp(p, mine, shallow=False):
                diff = difflib.unified_diff(
                    mine.read_text().splitlines(),
                    p.read_text().splitlines(),
                    str(mine),
                    "generated",
                    lineterm="",
                )
                problems.append("\n".join(list(diff)[:40]))
    if problems:
        print("generated code drifted from the protos; run `python scripts/gen_protos.py`:", file=sys.stderr)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1
    print("protos: generated code is up to date")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code differs")
    args = parser.parse_args()
    if args.check:
        return check()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        for old in _committed_files():
            old.unlink()
        for p in fresh:
            shutil.copyfile(p, PACKAGE_DIR / p.name)
        for init in ("rft/__init__.py", "rft/v1/__init__.py"):
            shutil.copyfile(Path(tmp) / init, PROTO_ROOT / init)
    print(f"wrote {len(fresh)} files to {PACKAGE_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
