"""Name -> component registries (algorithms, workflows, rewards, engines, stores, sync methods, monitors).

A name is either registered (`@REG.register("grpo", "grpo_alias")`) or a dotted-path plug-in
`my_pkg.my_mod:MyWorkflow` (also `my_pkg.my_mod.MyWorkflow`), imported on first use.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """Unknown name or a plug-in that cannot be imported; the message lists what is known."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def import_object(path: str) -> object:
    """Import `pkg.mod:attr` (or `pkg.mod.attr`)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise RegistryError(f"{path!r} is not a dotted path like `my_pkg.my_mod:MyClass`")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"cannot import plug-in module {module_name!r} for {path!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RegistryError(
                f"module {module_name!r} has no attribute {attr!r} (plug-in {path!r})"
            ) from None
    return obj


class Registry(Generic[T]):
    """A named collection of components of one kind."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._items and self._items[key] is not obj:
                    raise ValueError(f"{self.kind} {key!r} is already registered")
                self._items[key] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        if ":" in name or "." in name:
            return import_object(name)  # type: ignore[return-value]
        known = sorted(self._items)
        hint = difflib.get_close_matches(name, known, n=1)
        msg = f"unknown {self.kind} {name!r}"
        msg += f"; did you mean {hint[0]!r}?" if hint else ""
        msg += f" Known: {', '.join(known)}; or give a plug-in as `my_pkg.my_mod:Name`."
        raise RegistryError(msg)

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
