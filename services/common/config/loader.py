"""Load a run's YAML into the frozen `RFTConfig`: `${oc.env:VAR}` interpolation, `--set` overrides,
environment overrides of addresses, ports and secrets, stage validation, and path-named errors."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from services.common.config.errors import ConfigError, Problem, problems_from_validation
from services.common.config.root import RFTConfig
from services.common.config.services import SERVICE_NAMES

# Environment variables may override only where services are and their secrets.
ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    "RFT_AUTH_TOKEN": ("services", "auth_token"),
    "RFT_REDIS_URL": ("services", "buffer", "redis_url"),
    "RFT_TLS_CERT_FILE": ("services", "tls", "cert_file"),
    "RFT_TLS_KEY_FILE": ("services", "tls", "key_file"),
    "RFT_TLS_CA_FILE": ("services", "tls", "ca_file"),
}
for _svc in SERVICE_NAMES:
    for _key in ("host", "port", "address", "metrics_port"):
        ENV_OVERRIDES[f"RFT_{_svc.upper()}_{_key.upper()}"] = ("services", _svc, _key)


def _set_path(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def apply_env_overrides(tree: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    out = copy.deepcopy(tree)
    for var, path in ENV_OVERRIDES.items():
        if var in environ:
            _set_path(out, path, environ[var])
    return out


def _read_tree(source: str, text: str, overrides: Sequence[str]) -> dict[str, Any]:
    try:
        yaml.safe_load(text)  # precise line/column for syntax errors
    except yaml.YAMLError as exc:
        raise ConfigError(source, [Problem("", f"YAML syntax error: {exc}")]) from None
    try:
        conf = OmegaConf.create(text or "{}")
        for item in overrides:
            if "=" not in item:
                raise ConfigError(source, [Problem(item, "override must look like key.path=value")])
            conf = OmegaConf.merge(conf, OmegaConf.from_dotlist([item]))
        tree = OmegaConf.to_container(conf, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        msg = str(exc).splitlines()[0]
        if "oc.env" in str(exc) or "environment variable" in msg:
            msg += "; set the variable or give a default: ${oc.env:VAR,default}"
        raise ConfigError(source, [Problem(str(key), msg)]) from None
    if not isinstance(tree, dict):
        raise ConfigError(
            source, [Problem("", f"the top level must be a mapping, got {type(tree).__name__}")]
        )
    return tree


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def stage_tree(base: dict[str, Any], stage: Mapping[str, Any]) -> dict[str, Any]:
    """The full config tree of one stage: the base with the stage's sections merged over it."""
    tree = {k: v for k, v in base.items() if k != "stages"}
    for section, value in stage.items():
        if section == "stage_name" or value is None:
            continue
        tree = _deep_merge(tree, {section: value})
    tree["name"] = f"{tree.get('name', 'rft')}/{stage['stage_name']}"
    return tree


def validate_tree(tree: dict[str, Any], source: str = "<config>") -> RFTConfig:
    try:
        config = RFTConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(source, problems_from_validation(RFTConfig, exc)) from None
    problems: list[Problem] = []
    for i, stage in enumerate(config.stages):
        try:
            RFTConfig.model_validate(stage_tree(tree, stage.model_dump(exclude_none=True)))
        except ValidationError as exc:
            problems += problems_from_validation(RFTConfig, exc, prefix=f"stages[{i}]")
    if problems:
        raise ConfigError(source, problems)
    return config


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    text: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> RFTConfig:
    """Load and validate a run config from a YAML file (or `text`). Raises ConfigError."""
    source = str(path) if path is not None else "<text>"
    if text is None:
        if path is None:
            raise ValueError("give a path or text")
        p = Path(path)
        if not p.is_file():
            raise ConfigError(source, [Problem("", "file not found")])
        text = p.read_text()
    tree = _read_tree(source, text, overrides)
    tree = apply_env_overrides(tree, os.environ if environ is None else environ)
    return validate_tree(tree, source)
