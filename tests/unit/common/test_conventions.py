"""Conventions checked by tools: services never import each other; generated protos match the protos."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ("buffer", "explorer", "trainer", "synchronizer")


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_services_never_import_each_other():
    offenders = []
    for svc in SERVICES:
        for path in (ROOT / "services" / svc).rglob("*.py"):
            for mod in _imported_modules(path):
                parts = mod.split(".")
                if len(parts) >= 2 and parts[0] == "services" and parts[1] in SERVICES and parts[1] != svc:
                    offenders.append(f"{path.relative_to(ROOT)} imports {mod}")
    for path in (ROOT / "services" / "common").rglob("*.py"):
        for mod in _imported_modules(path):
            parts = mod.split(".")
            if len(parts) >= 2 and parts[0] == "services" and parts[1] in SERVICES:
                offenders.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not offenders, "services must talk over gRPC, not imports:\n" + "\n".join(offenders)


def test_generated_protos_have_not_drifted():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_module_opens_with_a_docstring():
    missing = [
        str(p.relative_to(ROOT))
        for top in ("services", "launcher")
        for p in (ROOT / top).rglob("*.py")
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert not missing, f"modules without a docstring: {missing}"
