"""Reading deploy/'s compose files as `docker compose` does, without Docker, for the static deploy tests
(tests/unit/deploy): the variables of deploy/.env.example, compose's variable substitution, and its merge
of one service across override files."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

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


def merge_service(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge of one service: mappings merged, `volumes` by target, `ports` concatenated, the
    rest (command, ...) replaced."""
    out = dict(base)
    for key, value in over.items():
        if key == "volumes":
            target = lambda v: v["target"] if isinstance(v, dict) else v.split(":")[1]  # noqa: E731
            kept = [v for v in base.get(key, []) if target(v) not in {target(o) for o in value}]
            out[key] = kept + value
        elif key == "ports":
            out[key] = base.get(key, []) + value
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = {**base[key], **value}
        else:
            out[key] = value
    return out


def merged_services(override: Path, what: str) -> dict[str, Any]:
    """The services of `docker compose --env-file .env.example -f docker-compose.yml -f OVERRIDE config`, as
    the compose CLI merges them; a loud skip naming `what` when no compose CLI is installed."""
    import pytest  # a test helper: only the tests that merge need pytest and the CLI

    from tests.support.docker_engine import compose_cli

    cli = compose_cli()
    if cli is None:
        pytest.skip(f"!!! neither `docker compose` nor `docker-compose` is installed: the merge of the {what} "
                    "override was SKIPPED; the structural checks above ran")  # fmt: skip
    done = subprocess.run(
        [*cli, "--env-file", str(DEPLOY / ".env.example"), "-f", str(DEPLOY / "docker-compose.yml"),
         "-f", str(override), "config"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["services"]
