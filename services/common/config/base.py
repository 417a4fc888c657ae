"""Base class of every config section: frozen, unknown keys refused, aliases of Trinity-RFT names normalised."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A frozen, strict config section. Defaults live only in the section classes."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, protected_namespaces=())


def normalise_alias(value: Any, aliases: dict[str, str]) -> Any:
    """Map a Trinity-RFT alias (e.g. `online` -> `nccl`) to its canonical name; other values pass through."""
    if isinstance(value, str):
        return aliases.get(value, value)
    return value
