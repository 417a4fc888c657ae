"""Fixtures of the deploy tests: a real Docker engine (installed and started when none answers) and the
project's images built without a registry, shared by every compose scenario of the session."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.compose_stack import build_images
from tests.support.docker_engine import ensure_engine


@pytest.fixture(scope="session")
def engine():
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip(
            "!!! the deploy test needs Linux and root (it installs the engine, SIGKILLs containers' "
            "processes from the host and reads the stack's volume): the deploy test is SKIPPED"
        )
    eng = ensure_engine()
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def images(engine) -> dict[str, str]:
    """The project and Redis images, built without a registry (cached between runs)."""
    return build_images()
