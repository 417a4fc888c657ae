"""Optional dependencies (the project's extras, vLLM): importing one where it is used, or an error that
says what needs it and how to install it, with the import's own reason after it."""

from __future__ import annotations

import importlib
from types import ModuleType


def import_extra(module: str, missing: str, error: type[Exception] = ImportError) -> ModuleType:
    """`module` imported, or `error` with `missing` (what needs it, how to install it) and the reason."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise error(f"{missing}: {exc}") from exc
