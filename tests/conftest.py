"""Test-wide settings: under CI, hypothesis runs a fixed set of examples so a run is repeatable. The vLLM
suite (tests/vllm_engine) runs from the vLLM environment (.venv-vllm) and only there; that environment runs only
it (the rest needs the main environment's extras)."""

from __future__ import annotations

import importlib.util
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

if importlib.util.find_spec("vllm") is not None:
    collect_ignore = ["unit", "integration", "e2e", "deploy"]
else:
    collect_ignore = ["vllm_engine"]
