"""Test-wide settings: under CI, hypothesis runs a fixed set of examples so a run is repeatable. The vLLM
suite (tests/vllm_engine) runs from the vLLM environment (.venv-vllm) and only there; that environment runs only
it (the rest needs the main environment's extras).

Under pytest-xdist (`scripts/test.sh` runs `-n 2`) every test file is one unit of work, so a file's module
fixtures are made once and its tests run in order on one worker; the deploy tests are one unit (one Docker
engine, one compose stack at a time); and the units go out longest first (deploy, then e2e, integration,
unit), so the short unit files fill the workers' ends."""

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


def _rank(item: pytest.Item) -> int:
    parts = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent).parts
    top = parts[0] if len(parts) > 1 else ""
    return _ORDER.index(top) if top in _ORDER else len(_ORDER)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # a plain run (and xdist's controller) keeps the collection order
    items.sort(key=_rank)  # stable: a file's tests keep their order


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # only called under xdist
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        """One test file per unit of work, and the deploy tests (one engine, one stack at a time) one unit."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/deploy" if path.startswith("tests/deploy/") else path

    return FileScheduling(config, log)
