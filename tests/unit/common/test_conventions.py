"""Conventions checked by tools: services never import each other (services/common and services/weight_sync
are shared, and common never imports weight_sync); generated protos match the protos."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from services.common.config.sync_plan import STYLE_ALIASES, STYLES

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
    # the shared wings: services/common imports no service and not services/weight_sync (which builds on
    # it); services/weight_sync imports no service. Every service may import both.
    for wing, forbidden in (("common", (*SERVICES, "weight_sync")), ("weight_sync", SERVICES)):
        for path in (ROOT / "services" / wing).rglob("*.py"):
            for mod in _imported_modules(path):
                parts = mod.split(".")
                if len(parts) >= 2 and parts[0] == "services" and parts[1] in forbidden:
                    offenders.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not offenders, (
        "services must talk over gRPC, not imports; services/common must not import services/weight_sync:\n"
        + "\n".join(offenders)
    )


def test_nothing_in_services_or_the_launcher_imports_the_tinker_front_end():
    """tinker_api/ composes the trainer's and the explorer's code in one process (docs/tinker.md); the
    services and the launcher stay free of it (`rft serve tinker` runs it as a module)."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {mod}"
        for top in ("services", "launcher")
        for path in (ROOT / top).rglob("*.py")
        for mod in _imported_modules(path)
        if mod.split(".")[0] == "tinker_api"
    ]
    assert not offenders, "\n".join(offenders)


def test_generated_protos_have_not_drifted():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_module_opens_with_a_docstring():
    missing = [
        str(p.relative_to(ROOT))
        for top in ("services", "launcher", "tinker_api")
        for p in (ROOT / top).rglob("*.py")
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert not missing, f"modules without a docstring: {missing}"


# ---- one sync policy, one method registry ------------------------------------------------------------
# Only the policy object (services/common/config/sync_plan.py) reads a sync style, and only the method
# registry (services/weight_sync/) a method's name: every service asks them
# (`settings.sync_plan.pipelined()`, `settings.sync_method.broadcast`), never compares strings.
POLICY_HOMES = (ROOT / "services" / "common" / "config" / "sync_plan.py", ROOT / "services" / "weight_sync")
STYLE_NAMES = set(STYLES) | set(STYLE_ALIASES)
UNAMBIGUOUS_STYLES = STYLE_NAMES - {"fixed"}  # "fixed" is also e.g. a KL controller's kind


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _compares_sync_policy(node: ast.AST) -> bool:
    """`s.sync_style == ...`, `x.sync_method != ...`, `... in (..., "fully_async")`, `plan.style == "fixed"`."""
    if not isinstance(node, ast.Compare):
        return False
    operands = [node.left, *node.comparators]
    consts = set().union(*(_strings(op) for op in operands))
    others = " ".join(ast.unparse(op) for op in operands if not _strings(op)).lower()
    if "sync_style" in others or "sync_method" in others:
        return True
    if consts & UNAMBIGUOUS_STYLES:
        return True
    return bool(consts & STYLE_NAMES) and ("style" in others or "plan" in others)


def _outside_policy_homes(path: Path) -> bool:
    return not any(path == home or home in path.parents for home in POLICY_HOMES)


def test_no_service_compares_a_sync_style_or_method_outside_the_policy():
    found = []
    for path in sorted((ROOT / "services").rglob("*.py")):
        if not _outside_policy_homes(path) or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        tree = ast.parse(path.read_text(), str(path))
        found += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(tree)
            if _compares_sync_policy(node)
        ]
    assert found == [], (
        "ask services/common/config/sync_plan.py's SyncPlan or the method registry instead of comparing:\n"
        + "\n".join(found)
    )


def test_the_sync_policy_rule_catches_a_comparison():
    caught = (
        's.sync_style == "fully_async"',
        's.sync_style == "fixed" and s.sync_offset >= 1',
        'config.synchronizer.sync_method != "memory"',
        'self.style in ("trainer_driven", "fully_async")',
        'plan.style == "fixed"',
        'style == "dynamic_by_trainer"',
    )
    for source in caught:
        tree = ast.parse(source, mode="eval")
        assert any(_compares_sync_policy(n) for n in ast.walk(tree)), source
    for source in ('kl_args.get("kl_ctrl", "fixed") != "fixed"', 'store == "memory"', "step % interval == 0"):
        assert not _compares_sync_policy(ast.parse(source, mode="eval").body), source
    assert not _outside_policy_homes(ROOT / "services" / "common" / "config" / "sync_plan.py")
    assert not _outside_policy_homes(ROOT / "services" / "weight_sync" / "method.py")
    assert _outside_policy_homes(ROOT / "services" / "trainer" / "service.py")


def test_the_rule_would_have_caught_the_comparisons_this_policy_replaced():
    """The trainer's pipelining rule and the explorer's run-end rule, as they were written."""
    before = (
        'pipelined = s.sync_style == "fully_async" or (s.sync_style == "fixed" and s.sync_offset >= 1)',
        'core.until_run_ends = config.synchronizer.sync_style == "fully_async"',
        'if s.sync_style == "fully_async":\n    pass',
    )
    for source in before:
        assert any(_compares_sync_policy(n) for n in ast.walk(ast.parse(source))), source
