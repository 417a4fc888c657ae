"""Load a run's YAML into the frozen `RFTConfig`: `${oc.env:VAR}` interpolation, `--set` overrides
(list items by index: `stages.0.buffer.total_steps=12`), environment overrides of addresses, ports
and secrets, stage validation, and path-named errors. Beyond the section classes, a load refuses the
compatibility keys this project cannot honour (compat.py), twin keys that disagree and a run that
samples with no token limit (resolved.py); `config_warnings` lists the keys that load but do nothing."""

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

from services.common.config import compat
from services.common.config.errors import ConfigError, Problem, problems_from_validation
from services.common.config.resolved import token_limit_problems, twin_problems
from services.common.config.root import RFTConfig
from services.common.config.services import SERVICE_NAMES

# Environment variables may override only where services are and their secrets.
ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    "RFT_AUTH_TOKEN": ("services", "auth_token"),
    "RFT_REDIS_URL": ("services", "buffer", "redis_url"),
    "RFT_TLS_CERT_FILE": ("services", "tls", "cert_file"),
    "RFT_TLS_KEY_FILE": ("services", "tls", "key_file"),
    "RFT_TLS_CA_FILE": ("services", "tls", "ca_file"),
    "RFT_TLS_CLIENT_CERT_FILE": ("services", "tls", "client_cert_file"),
    "RFT_TLS_CLIENT_KEY_FILE": ("services", "tls", "client_key_file"),
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


def _override_value(item: str) -> tuple[str, Any]:
    """`key.path=value` -> (key path, value parsed as OmegaConf parses a dotlist: YAML scalars, lists,
    mappings, `${...}` interpolations kept)."""
    key, eq, text = item.partition("=")
    key = key.strip()
    if not eq or not key or any(not part for part in key.split(".")):
        raise ValueError("override must look like key.path=value")
    value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]), resolve=False)["v"]
    return key, value


def _apply_override(conf: Any, item: str) -> None:
    """One `--set`: mapping keys by name, list items by index (`stages.0.buffer.total_steps=12`)."""
    key, value = _override_value(item)
    node = conf
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        if OmegaConf.is_list(node):
            if not part.isdigit() or int(part) >= len(node):
                where = ".".join(parts[:depth]) or "<top>"
                raise ValueError(
                    f"{where} is a list of {len(node)} item(s); {part!r} is not an index of it (0..{len(node) - 1})"
                )
            node = node[int(part)]
        elif OmegaConf.is_dict(node):
            node = node.get(part)
            if node is None:  # a new section: OmegaConf.update creates it
                break
        else:
            break
    if node is not None and not OmegaConf.is_config(node):
        raise ValueError(f"{'.'.join(parts[:-1])} is a value, not a section")
    OmegaConf.update(conf, key, value, merge=True)


def _read_tree(source: str, text: str, overrides: Sequence[str]) -> dict[str, Any]:
    try:
        yaml.safe_load(text)  # precise line/column for syntax errors
    except yaml.YAMLError as exc:
        raise ConfigError(source, [Problem("", f"YAML syntax error: {exc}")]) from None
    try:
        conf = OmegaConf.create(text or "{}")
    except OmegaConfBaseException as exc:
        raise ConfigError(
            source, [Problem(str(getattr(exc, "full_key", "") or ""), str(exc).splitlines()[0])]
        ) from None
    except yaml.YAMLError as exc:  # OmegaConf's loader refuses duplicate keys (PyYAML keeps the last)
        detail = " ".join(str(exc).split())
        raise ConfigError(source, [Problem("", f"YAML error: {detail}; give each key once")]) from None
    for item in overrides:
        try:
            _apply_override(conf, item)
        except (OmegaConfBaseException, ValueError, TypeError, KeyError, IndexError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(source, [Problem(f"--set {item}", msg)]) from None
    try:
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


# Keys whose being unset means something (resolved.py derives them: on a GPU shared with the trainer
# the engine's share is 0.3 and vLLM sleeps): a dumped tree leaves them out unless the config set them,
# so the config every process of `rft run` reads resolves as the user's does.
DERIVED_WHEN_UNSET = (
    ("explorer", "rollout_model", "gpu_memory_utilization"),
    ("explorer", "rollout_model", "enable_sleep_mode"),
)


def dump_tree(config: RFTConfig) -> dict[str, Any]:
    """`config` as a JSON tree that loads back to the same resolved config (`DERIVED_WHEN_UNSET` keys
    left out where unset)."""
    tree = config.model_dump(mode="json")
    for path in DERIVED_WHEN_UNSET:
        owner: Any = config
        sub = tree
        for key in path[:-1]:
            owner, sub = getattr(owner, key), sub[key]
        if path[-1] not in owner.model_fields_set:
            sub.pop(path[-1], None)
    return tree


def stage_tree(base: dict[str, Any], stage: Mapping[str, Any]) -> dict[str, Any]:
    """The full config tree of one stage: the base with the stage's sections merged over it."""
    tree = {k: v for k, v in base.items() if k != "stages"}
    for section, value in stage.items():
        if section == "stage_name" or value is None:
            continue
        tree = _deep_merge(tree, {section: value})
    tree["name"] = f"{tree.get('name', 'rft')}/{stage['stage_name']}"
    return tree


def _checks(config: RFTConfig, samples: bool = True) -> list[Problem]:
    """What the section classes cannot see alone: refused compatibility keys, twin keys that
    disagree and (`samples`) a run that samples with no response-token limit."""
    found = compat.refusals(config) + twin_problems(config)
    return found + (token_limit_problems(config) if samples else [])


def stage_configs(config: RFTConfig) -> list[tuple[str, RFTConfig]]:
    """(`stages[i]`, the full config of stage i) for each stage of a validated config."""
    tree = dump_tree(config)
    return [
        (f"stages[{i}]", RFTConfig.model_validate(stage_tree(tree, stage.model_dump(exclude_none=True))))
        for i, stage in enumerate(config.stages)
    ]


def _stage_lines(base: list[str], prefix: str, lines: list[str]) -> list[str]:
    """A stage's lines that the run's own lines do not already say."""
    return [f"{prefix}.{line}" for line in lines if line not in base]


def config_warnings(config: RFTConfig) -> list[str]:
    """One line per key, of the run and of its stages, that loads but has no effect here (compat.py)."""
    base = compat.warnings(config)
    out = list(base)
    for prefix, stage in stage_configs(config):
        out += _stage_lines(base, prefix, compat.warnings(stage))
    return out


def validate_tree(tree: dict[str, Any], source: str = "<config>") -> RFTConfig:
    try:
        config = RFTConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(source, problems_from_validation(RFTConfig, exc)) from None
    # with stages, each stage decides whether it samples (a train stage needs no token limit)
    problems: list[Problem] = _checks(config, samples=not config.stages)
    base = {str(p) for p in problems}
    for i, stage in enumerate(config.stages):
        try:
            stage_config = RFTConfig.model_validate(stage_tree(tree, stage.model_dump(exclude_none=True)))
        except ValidationError as exc:
            problems += problems_from_validation(RFTConfig, exc, prefix=f"stages[{i}]")
            continue
        problems += [
            Problem(f"stages[{i}].{p.path}", p.message) for p in _checks(stage_config) if str(p) not in base
        ]
    if problems:
        raise ConfigError(source, problems)
    return config


def _name_env_vars(problems: list[Problem], environ: Mapping[str, str]) -> list[Problem]:
    """Say which environment variable gave a bad value (RFT_BUFFER_PORT=abc -> services.buffer.port)."""
    by_path = {".".join(path): var for var, path in ENV_OVERRIDES.items() if var in environ}
    out = []
    for p in problems:
        var = by_path.get(p.path)
        out.append(Problem(p.path, f"{p.message} (from the environment variable {var})") if var else p)
    return out


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
    environ = os.environ if environ is None else environ
    tree = _read_tree(source, text, overrides)
    tree = apply_env_overrides(tree, environ)
    try:
        return validate_tree(tree, source)
    except ConfigError as exc:
        raise ConfigError(source, _name_env_vars(exc.problems, environ)) from None
