"""Base for the small frozen parameter objects that algorithms take.

Each loss or estimator with tunable constants declares them as a frozen dataclass deriving from
``FrozenParams``; the defaults there are the only defaults.  A plain dict from a YAML config is
turned into one with ``from_dict``, which rejects unknown keys with a clear ``ValueError`` naming
the key and a close match.  ``_aliases`` lets a class also accept Trinity-RFT spellings
(``clip_range_low``) for veRL names (``clip_ratio_low``).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

__all__ = ["FrozenParams", "unknown_key_error"]

P = TypeVar("P", bound="FrozenParams")


def unknown_key_error(owner: str, key: str, allowed: list[str], what: str = "key") -> ValueError:
    """A ``ValueError`` for ``key`` not in ``allowed``, with a close-match suggestion."""
    message = f"{owner}: unknown {what} {key!r}; allowed {what}s: {', '.join(sorted(allowed)) or '(none)'}"
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        message += f"; did you mean {close[0]!r}?"
    return ValueError(message)


@dataclasses.dataclass(frozen=True)
class FrozenParams:
    """Mixin for frozen parameter dataclasses: ``from_dict``, ``coerce`` and ``to_dict``."""

    _aliases: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def from_dict(cls: type[P], data: Mapping[str, Any] | None = None) -> P:
        """Build from a mapping; unknown keys raise ``ValueError`` naming the key."""
        known = [f.name for f in dataclasses.fields(cls) if f.init]
        kwargs: dict[str, Any] = {}
        for key, value in (data or {}).items():
            name = cls._aliases.get(key, key)
            if name not in known:
                raise unknown_key_error(cls.__name__, key, known + list(cls._aliases))
            if name in kwargs:
                raise ValueError(f"{cls.__name__}: {key!r} given twice (also under another spelling)")
            kwargs[name] = value
        return cls(**kwargs)

    @classmethod
    def from_section(cls: type[P], section: Any) -> P:
        """Build from a config section that holds every field under the same name (an attribute each)."""
        return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls) if f.init})

    @classmethod
    def coerce(cls: type[P], value: P | Mapping[str, Any] | None) -> P:
        """Accept an instance, a mapping (via ``from_dict``) or ``None`` (all defaults)."""
        if isinstance(value, cls):
            return value
        if value is None or isinstance(value, Mapping):
            return cls.from_dict(value)
        raise TypeError(f"expected {cls.__name__}, a dict or None, got {type(value).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a plain dict (for logging and presets)."""
        return dataclasses.asdict(self)
