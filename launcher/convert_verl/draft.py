"""The run config being built from one veRL command, and its YAML text.

A `Draft` hands out the command's values (`get` marks a key as handled), takes the RFT Mesh values
(`set`, remembering which veRL key each came from so the YAML carries it as a comment) and the keys
with no equivalent (`drop`, which become `# veRL key=value: no equivalent (reason)` lines and
warnings). `render` writes the tree as block YAML with those comments.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from launcher.convert_verl.overrides import Override

Path = tuple[str | int, ...]
SECTION_ORDER = (
    "project",
    "name",
    "checkpoint_root_dir",
    "continue_from_checkpoint",
    "algorithm",
    "model",
    "cluster",
    "buffer",
    "explorer",
    "synchronizer",
    "trainer",
    "monitor",
)


def split_path(path: str | Path) -> Path:
    return tuple(path.split(".")) if isinstance(path, str) else path


class Draft:
    """One conversion in progress."""

    def __init__(self, overrides: list[Override]):
        self.args: dict[str, Override] = {}
        for o in overrides:  # the last one of a repeated key wins, as in Hydra
            self.args.pop(o.key, None)
            self.args[o.key] = o
        self.used: set[str] = set()
        self.tree: dict[str, Any] = {}
        self.comments: dict[Path, str] = {}
        self.origin: dict[Path, list[str]] = {}
        self.dropped: list[tuple[str, str, str, bool]] = []  # (key, value text, reason, same here)
        self.warnings: list[str] = []
        self.notes: list[str] = []

    # -- reading the veRL command -------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.args

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key` (or `default` when the command leaves it out); marks it handled."""
        self.used.add(key)
        return self.args[key].value if key in self.args else default

    def peek(self, key: str, default: Any = None) -> Any:
        """The value of `key` (or `default`) without marking it handled: for a rule that depends on a key
        another rule or the table converts."""
        return self.args[key].value if key in self.args else default

    def source(self, *keys: str) -> str:
        """`key=value` of the given keys that the command sets, for a comment."""
        return ", ".join(f"{k}={self.args[k].text}" for k in keys if k in self.args)

    def source_or_default(self, key: str, value: Any) -> str:
        """`key=value` as written, or `veRL default key=value` when the command leaves it to veRL."""
        return self.source(key) or f"veRL default {key}={value}"

    def unused(self) -> list[str]:
        return [k for k in self.args if k not in self.used]

    # -- writing the run config ---------------------------------------------------------------
    def set(self, path: str | Path, value: Any, comment: str = "", keys: tuple[str, ...] = ()) -> None:
        """Set `path` (dotted, or a tuple with list indices) to `value`, noting where it came from."""
        p = split_path(path)
        node: Any = self.tree
        for part in p[:-1]:
            if isinstance(node, dict):
                node = node.setdefault(part, {})
            else:
                node = node[part]
        node[p[-1]] = value
        for key in keys:
            self.used.add(key)
        self.origin[p] = list(keys)
        text = comment or self.source(*keys)
        if text:
            self.comments[p] = text

    def comment(self, path: str | Path, text: str) -> None:
        self.comments[split_path(path)] = text

    def unset(self, path: Path) -> None:
        node: Any = self.tree
        for part in path[:-1]:
            node = node[part]
        node.pop(path[-1], None)
        self.comments.pop(path, None)
        self.origin.pop(path, None)

    def drop(self, key: str, reason: str, warn: bool = True, same: bool = False) -> None:
        """`key` has no equivalent: a comment line in the YAML and, unless `warn` is false, a warning.
        `same`: nothing needs setting, as this project behaves so anyway."""
        self.used.add(key)
        text = self.args[key].text if key in self.args else ""
        self.dropped.append((key, text, reason, same))
        if warn:
            self.warnings.append(f"veRL {key}={text}: no equivalent ({reason})")

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def note(self, message: str) -> None:
        self.notes.append(message)

    def ordered_tree(self) -> dict[str, Any]:
        """The tree with sections in the usual order and empty sections left out."""
        tree = copy.deepcopy(self.tree)
        out = {k: tree.pop(k) for k in SECTION_ORDER if k in tree}
        out.update(tree)
        return {k: v for k, v in out.items() if v != {}}


def _scalar(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, allow_unicode=True).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text


def render(tree: dict[str, Any], comments: dict[Path, str], header: list[str]) -> str:
    """Block YAML of `tree`, a trailing `# comment` on each path that has one, after `header` lines."""

    def tail(path: Path) -> str:
        text = comments.get(path)
        return f"  # {text}" if text else ""

    def mapping(node: dict[str, Any], path: Path, indent: int) -> list[str]:
        pad, lines = "  " * indent, []
        for key, value in node.items():
            p = (*path, key)
            if isinstance(value, dict) and value:
                lines += [f"{pad}{key}:{tail(p)}", *mapping(value, p, indent + 1)]
            elif isinstance(value, list) and value:
                lines += [f"{pad}{key}:{tail(p)}", *sequence(value, p, indent + 1)]
            else:
                lines.append(f"{pad}{key}: {_scalar(value)}{tail(p)}")
        return lines

    def sequence(items: list[Any], path: Path, indent: int) -> list[str]:
        pad, lines = "  " * indent, []
        for i, item in enumerate(items):
            p = (*path, i)
            if isinstance(item, dict) and item:
                sub = mapping(item, p, indent + 1)
                lines += [f"{pad}- {sub[0].lstrip()}", *sub[1:]]
            else:
                lines.append(f"{pad}- {_scalar(item)}{tail(p)}")
        return lines

    body = mapping(tree, (), 0)
    return "\n".join([*header, *body]) + "\n"
