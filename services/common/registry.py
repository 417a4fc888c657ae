"""Name -> component registries with aliases and dotted-path plug-ins.

Every pluggable component (advantage estimators, policy losses, KL estimators, reward scorers and
managers, workflows, engines, stores, sync methods, monitors) lives in a ``Registry``.  Configs name
a component by a short string (``"grpo"``); a user plug-in is named by a dotted path
``"my_pkg.my_mod:my_fn"`` and imported on first use.  A misspelt name fails loudly with the known
names and a close match, never silently.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry", "RegistryError", "UnknownNameError", "import_object"]

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised for a name that is neither registered nor a dotted path ``pkg.mod:obj``."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


RegistryError = UnknownNameError


def import_object(path: str) -> object:
    """Import ``"pkg.mod:obj"`` (``obj`` may itself be dotted, ``"pkg.mod:Class.attr"``).

    Raises ``ImportError`` naming the path when the module or the attribute is missing.
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ImportError(f"plug-in path {path!r} must look like 'package.module:object'")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import module {module_name!r} of plug-in {path!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ImportError(f"plug-in {path!r}: {module_name!r} has no attribute {attr_path!r}") from exc
    return obj


class Registry(Generic[T]):
    """Maps names (and aliases) to objects of one kind.

    >>> LOSSES: Registry[Callable] = Registry("policy loss")
    >>> @LOSSES.register("vanilla", "ppo")
    ... def vanilla(): ...
    >>> LOSSES.get("ppo") is vanilla
    True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._canonical: dict[str, str] = {}  # every name or alias -> canonical name

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator registering an object under ``name`` and optional ``aliases``."""

        def decorator(obj: T) -> T:
            self.add(name, obj, *aliases)
            return obj

        return decorator

    def add(self, name: str, obj: T, *aliases: str) -> None:
        """Register ``obj`` without a decorator; a name already taken raises ``ValueError``."""
        for key in (name, *aliases):
            if ":" in key:
                raise ValueError(f"{self.kind} name {key!r} must not contain ':' (reserved for plug-ins)")
            if key in self._canonical:
                raise ValueError(f"{self.kind} {key!r} is already registered")
        self._entries[name] = obj
        for key in (name, *aliases):
            self._canonical[key] = name

    def get(self, name: str) -> T:
        """Return the object for a registered name/alias or import a ``pkg.mod:obj`` plug-in."""
        if name in self._canonical:
            return self._entries[self._canonical[name]]
        if ":" in name:
            return import_object(name)  # type: ignore[return-value]
        known = sorted(self._canonical)
        message = f"unknown {self.kind} {name!r}; known: {', '.join(known)}"
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        message += " (a plug-in is given as 'package.module:object')"
        raise UnknownNameError(message)

    def canonical_name(self, name: str) -> str:
        """The canonical name of a registered name or alias (plug-in paths are returned as is)."""
        if ":" in name:
            return name
        self.get(name)  # raises with a suggestion when unknown
        return self._canonical[name]

    def names(self, include_aliases: bool = False) -> list[str]:
        """Sorted canonical names (and aliases when asked)."""
        return sorted(self._canonical if include_aliases else self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._canonical

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
