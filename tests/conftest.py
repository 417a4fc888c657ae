"""Test-wide settings: under CI, hypothesis runs a fixed set of examples so a run is repeatable. The vLLM
suite (tests/vllm_engine) runs from the vLLM environment (.venv-vllm) and only there; that environment runs only
it (the rest needs the main environment's extras).

Under pytest-xdist (`scripts/test.sh` runs `-n 2 --dist loadgroup`) every test file is one group, so a
file's module fixtures are made once and its tests run in order on one worker; the deploy tests are one
group (one Docker engine, one compose stack at a time); and the groups go out longest first (deploy, then
e2e, integration, unit), so the short unit files fill the workers' ends."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

if importlib.util.find_spec("vllm") is not None:
    collect_ignore = ["unit", "integration", "e2e", "deploy"]
else:
    collect_ignore = ["vllm_engine"]


_ORDER = ("deploy", "e2e", "integration", "unit")  # longest groups first


def _group(item: pytest.Item) -> tuple[int, str]:
    path = Path(str(item.path)).resolve()
    parts = path.relative_to(Path(__file__).resolve().parent).parts
    top = parts[0] if len(parts) > 1 else ""
    rank = _ORDER.index(top) if top in _ORDER else len(_ORDER)
    return rank, ("deploy" if top == "deploy" else str(path))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "no":
        return  # a plain run keeps the collection order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)[1]))
    items.sort(key=lambda item: _group(item)[0])  # stable: a file's tests keep their order
