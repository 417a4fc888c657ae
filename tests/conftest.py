"""Test-wide settings: under CI, hypothesis runs a fixed set of examples so a run is repeatable."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
