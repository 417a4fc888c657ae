"""Config errors that name the path, the bad value, and the allowed values or a close match."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """A config file that cannot be used. `str()` lists every problem, one per line."""

    def __init__(self, source: str, problems: Sequence[Problem]):
        self.source = source
        self.problems = list(problems)
        lines = [f"invalid config {source}:"] + [f"  {p}" for p in self.problems]
        super().__init__("\n".join(lines))


def format_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def close_match(word: str, choices: Sequence[str]) -> str | None:
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _unwrap(tp: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(tp) for t in _unwrap(arg)]
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    return [tp]


def _annotation_at(root: type[BaseModel], loc: Sequence[str | int]) -> Any:
    """Walk the model's type annotations along `loc`; None where the walk leaves the typed tree."""
    current: Any = root
    for part in loc:
        nxt = None
        for tp in _unwrap(current):
            origin = typing.get_origin(tp)
            if isinstance(part, str) and isinstance(tp, type) and issubclass(tp, BaseModel):
                field = tp.model_fields.get(part)
                if field is not None:
                    nxt = field.annotation
            elif isinstance(part, int) and origin in (list, tuple):
                nxt = typing.get_args(tp)[0]
            elif isinstance(part, str) and origin is dict:
                nxt = typing.get_args(tp)[1]
            if nxt is not None:
                break
        if nxt is None:
            return None
        current = nxt
    return current


def _model_fields_at(root: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    for tp in _unwrap(_annotation_at(root, loc) if loc else root):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return list(tp.model_fields)
    return []


def _literal_choices(root: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    for tp in _unwrap(_annotation_at(root, loc)):
        if typing.get_origin(tp) is typing.Literal:
            return [str(a) for a in typing.get_args(tp)]
    return []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def problems_from_validation(root: type[BaseModel], err: ValidationError, prefix: str = "") -> list[Problem]:
    """Turn pydantic errors into path-named problems with allowed values and suggestions."""
    problems = []
    for e in err.errors():
        loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith(("function-", "literal[")))]
        # pydantic puts union branch names into loc (e.g. 'str', 'list[...]'); keep the field path only.
        loc = [p for p in loc if isinstance(p, int) or not any(c in p for c in "[]'")]
        path = (prefix + "." if prefix and loc else prefix) + format_path(loc)
        kind = e["type"]
        value = e.get("input")
        if kind == "extra_forbidden":
            key = str(loc[-1])
            known = _model_fields_at(root, loc[:-1])
            hint = close_match(key, known)
            msg = f"unknown key (value {_short(value)})"
            msg += (
                f"; did you mean `{hint}`?"
                if hint
                else (f"; known keys: {', '.join(known)}" if known else "")
            )
        elif kind == "literal_error":
            choices = _literal_choices(root, loc)
            msg = f"{_short(value)} is not allowed; allowed: {', '.join(map(repr, choices))}"
            hint = close_match(str(value), choices) if isinstance(value, str) else None
            if hint:
                msg += f"; did you mean `{hint}`?"
        elif kind == "missing":
            msg = "required key is missing"
        else:
            text = e["msg"].removeprefix("Value error, ")
            msg = f"{_short(value)}: {text}" if not isinstance(value, dict) else text
        problems.append(Problem(path, msg))
    return problems
