"""veRL's command-line overrides (Hydra syntax) as typed values: `key=value`, `+key=value` (add a key),
`++key=value` (add or override), lists `[a,b]`, dicts `{k: v}`, quoted strings, and Hydra's scalar
types (`true`/`False` -> bool, `null` -> None, ints, floats such as `1e-6`, anything else a string)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_OVERRIDE = re.compile(r"^(\+{0,2})([A-Za-z_][\w.\-/@]*)=(.*)$", re.S)
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Override:
    key: str
    value: Any
    text: str  # the value as written (after shell quoting), for comments and messages
    added: bool = False  # written with `+` or `++`


def _split_top(body: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside quotes, brackets, braces and `${...}` interpolations."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in body:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            cur.append(ch)
        elif ch in "[{(":
            depth += 1
            cur.append(ch)
        elif ch in "]})":
            depth -= 1
            cur.append(ch)
        elif ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_value(text: str) -> Any:
    """A Hydra override value as a Python value."""
    s = text.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    if s.startswith("[") and s.endswith("]"):
        inner = s[1:-1].strip()
        return [parse_value(p) for p in _split_top(inner)] if inner else []
    if s.startswith("{") and s.endswith("}") and not s.startswith("${"):
        inner = s[1:-1].strip()
        out: dict[str, Any] = {}
        for item in _split_top(inner) if inner else []:
            key, _, value = item.partition(":")
            out[str(parse_value(key))] = parse_value(value)
        return out
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    if _INT.match(s):
        return int(s)
    if _FLOAT.match(s) or low in ("inf", "-inf", "+inf", "nan"):
        return float(s)
    return s


def parse_override(word: str) -> Override | None:
    """`key=value` as an Override, or None for a word that is not one (a flag, `~key`, a stray word)."""
    m = _OVERRIDE.match(word)
    if m is None:
        return None
    plus, key, raw = m.groups()
    return Override(key=key, value=parse_value(raw), text=raw, added=bool(plus))
