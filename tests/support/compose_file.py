"""Reading deploy/'s compose files as `docker compose` does, without Docker, for the static deploy tests
(tests/unit/deploy): the variables of deploy/.env.example, and compose's variable substitution."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def env_example() -> dict[str, str]:
    """deploy/.env.example as compose reads the .env copied from it."""
    env = {}
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def interpolate(node: Any, env: dict[str, str], used: set[str]) -> Any:
    """Compose's variable substitution: ${VAR}, ${VAR:-default}, ${VAR:?error}; `$$` is a literal `$`.
    Every variable met is added to `used`."""
    if isinstance(node, dict):
        return {k: interpolate(v, env, used) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, env, used) for v in node]
    if not isinstance(node, str):
        return node

    def sub(match: re.Match[str]) -> str:
        name, op, arg = match.groups()
        used.add(name)
        if env.get(name):
            return env[name]
        if op and op.endswith("?"):
            raise AssertionError(f"${{{name}}} is required: {arg}")
        return arg if op and op.endswith("-") else ""

    return _VAR.sub(sub, node.replace("$$", "\0")).replace("\0", "$")
