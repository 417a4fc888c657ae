"""Every component name of a run config, resolved before anything starts (`rft config check`, `rft run`).

Loading a config checks its shape and its fixed choices (`selector_type`, `priority_fn`, `engine_type`,
`monitor_type`, `store`, `sample_strategy` are literals refused at load with a
suggestion). The names that registries resolve are checked here, against the same registries the
services use, so a typo or a plug-in that does not import fails in a second instead of as a service
that dies at start (or, before, an explorer that retried a missing reward function until a deadline):

    algorithm.advantage_fn, policy_loss_fn, kl_penalty_fn, kl_loss_fn, reward_manager   trainer registries
    algorithm.entropy_loss_fn                                                           default | none
    buffer.explorer_input.{taskset,tasksets[i],eval_tasksets[i]}.default_workflow_type,
        explorer_input.default_workflow_type, default_eval_workflow_type                WORKFLOWS (a class)
    ... .default_reward_fn_type                                                         REWARD_SCORERS (callable)
    ... .workflow_args.env of a `multi_turn` taskset                                    ENVIRONMENTS
    explorer.rollout_model.tool_call_parser                                             TOOL_CALL_PARSERS
    synchronizer.sync_method                                                            SYNC_METHODS (a class)

A `module:object` name is imported (after the run's plug-in folders, `plugin_dirs` and `--plugin-dir`,
are loaded, so names their modules register are known too). Where a trainer runs, the algorithm
preset is then resolved as the trainer resolves it (`TrainerSettings`), which checks every `*_args`.
Each stage of `stages:` is checked as the full config it runs with (paths `stages[i]. ...`). Every
problem is reported, each with its path, the known names and the closest one.

Registries are imported only for names a config sets: the algorithm and workflow registries import
torch (a second or two), the reward scorers do not.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from services.common.config import RFTConfig, TasksetConfig
from services.common.config.errors import Problem, close_match
from services.common.config.loader import stage_configs
from services.common.plugins import PluginError, load_plugin_dirs, resolve_plugin_dirs
from services.common.registry import Registry, import_object

__all__ = ["check_config", "check_names", "config_names"]


@dataclass(frozen=True)
class Kind:
    """One kind of name: what it is called, where its registry lives, what a plug-in must be."""

    label: str
    module: str
    attribute: str
    must_be: str = "callable"  # "callable" | "class"

    def registry(self) -> Registry[Any] | tuple[str, ...]:
        return getattr(importlib.import_module(self.module), self.attribute)


_ALG = "services.trainer.algorithms"
ADVANTAGE = Kind("advantage estimator", _ALG, "ADVANTAGE_FNS")
POLICY_LOSS = Kind("policy loss", _ALG, "POLICY_LOSS_FNS")
KL = Kind("KL estimator", _ALG, "KL_FNS")
REWARD_MANAGER = Kind("reward manager", _ALG, "REWARD_MANAGERS", "class")
ENTROPY = Kind("entropy loss", "services.trainer.algorithms.presets", "ENTROPY_LOSS_FNS")
WORKFLOW = Kind("workflow", "services.explorer.workflows", "WORKFLOWS", "class")
ENVIRONMENT = Kind("environment", "services.explorer.workflows", "ENVIRONMENTS")
REWARD_FN = Kind("reward function", "services.common.rewards", "REWARD_SCORERS")
TOOL_PARSER = Kind("tool call parser", "services.explorer.tools", "TOOL_CALL_PARSERS")
SYNC_METHOD = Kind("weight sync method", "services.weight_sync", "SYNC_METHODS", "class")

_ALGORITHM_NAMES = {
    "advantage_fn": ADVANTAGE,
    "policy_loss_fn": POLICY_LOSS,
    "kl_penalty_fn": KL,
    "kl_loss_fn": KL,
    "entropy_loss_fn": ENTROPY,
    "reward_manager": REWARD_MANAGER,
}
_TRAINS = ("both", "train", "serve")


def _tasksets(config: RFTConfig) -> Iterator[tuple[str, TasksetConfig]]:
    ei = config.buffer.explorer_input
    base = "buffer.explorer_input"
    if ei.taskset is not None:
        yield f"{base}.taskset", ei.taskset
    for i, ts in enumerate(ei.tasksets):
        yield f"{base}.tasksets[{i}]", ts
    for i, ts in enumerate(ei.eval_tasksets):
        yield f"{base}.eval_tasksets[{i}]", ts


def config_names(config: RFTConfig) -> list[tuple[str, Kind, str]]:
    """(path, kind, name) of every registry name `config` sets (an unset one takes a built-in)."""
    out: list[tuple[str, Kind, str]] = []
    for key, kind in _ALGORITHM_NAMES.items():
        name = getattr(config.algorithm, key, None)
        if name is not None:
            out.append((f"algorithm.{key}", kind, name))
    ei = config.buffer.explorer_input
    for key in ("default_workflow_type", "default_eval_workflow_type"):
        if getattr(ei, key):
            out.append((f"buffer.explorer_input.{key}", WORKFLOW, getattr(ei, key)))
    if ei.default_reward_fn_type:
        out.append(("buffer.explorer_input.default_reward_fn_type", REWARD_FN, ei.default_reward_fn_type))
    for path, ts in _tasksets(config):
        if ts.default_workflow_type:
            out.append((f"{path}.default_workflow_type", WORKFLOW, ts.default_workflow_type))
        if ts.default_reward_fn_type:
            out.append((f"{path}.default_reward_fn_type", REWARD_FN, ts.default_reward_fn_type))
    if parser := config.explorer.rollout_model.tool_call_parser:
        out.append(("explorer.rollout_model.tool_call_parser", TOOL_PARSER, parser))
    if "sync_method" in config.synchronizer.model_fields_set:
        out.append(("synchronizer.sync_method", SYNC_METHOD, config.synchronizer.sync_method))
    return out


def _environments(config: RFTConfig) -> list[tuple[str, Kind, str]]:
    """The `workflow_args.env` of each taskset whose workflow is the registered `multi_turn`."""
    ei = config.buffer.explorer_input
    out = []
    for path, ts in _tasksets(config):
        is_eval = ".eval_tasksets[" in path
        workflow = ts.default_workflow_type or (ei.default_eval_workflow_type if is_eval else None)
        workflow = workflow or ei.default_workflow_type
        env = ts.workflow_args.get("env")
        if isinstance(env, str) and workflow and _canonical(WORKFLOW, workflow) == "multi_turn":
            out.append((f"{path}.workflow_args.env", ENVIRONMENT, env))
    return out


def _canonical(kind: Kind, name: str) -> str | None:
    registry = kind.registry()
    return registry.canonical_name(name) if isinstance(registry, Registry) and name in registry else None


def _check_plugin(kind: Kind, name: str) -> str | None:
    """Why plug-in `name` is unusable as a `kind`, or None."""
    try:
        obj = import_object(name)
    except ImportError as exc:
        return str(exc)
    if kind.must_be == "class" and not isinstance(obj, type):
        return f"{kind.label} plug-in {name!r} is {type(obj).__name__} {obj!r}, not a class"
    if not callable(obj):
        return f"{kind.label} plug-in {name!r} is {type(obj).__name__} {obj!r}, not callable"
    return None


def _check_name(kind: Kind, name: str) -> str | None:
    """Why `name` is not a usable `kind`, or None."""
    registry = kind.registry()
    if ":" in name and isinstance(registry, Registry):
        return _check_plugin(kind, name)
    known = registry.names(include_aliases=True) if isinstance(registry, Registry) else list(registry)
    if name in known:
        return None
    message = f"unknown {kind.label} {name!r}; known: {', '.join(known)}"
    hint = close_match(name, known)
    if hint:
        message += f"; did you mean `{hint}`?"
    if isinstance(registry, Registry):
        message += " (or a plug-in 'module:object')"
    return message


def _trainer_preset(config: RFTConfig) -> str | None:
    """Why the trainer could not resolve its algorithm (preset, args, batch sizes), or None."""
    from services.trainer.settings import TrainerSettings

    try:
        TrainerSettings.from_config(config)
    except (ValueError, KeyError, TypeError, ImportError) as exc:
        return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return None


def _problems(config: RFTConfig, runs: bool) -> list[Problem]:
    """The name problems of one full config; `runs`: it is a config the services run (preset check)."""
    names = config_names(config) + _environments(config)
    problems = [Problem(path, why) for path, kind, name in names if (why := _check_name(kind, name))]
    if runs and config.mode in _TRAINS and not any(p.path.startswith("algorithm.") for p in problems):
        why = _trainer_preset(config)
        if why:
            problems.append(Problem("algorithm", why))
    if runs and not any(p.path == "synchronizer.sync_method" for p in problems):
        why = _sync_method_fits(config)
        if why:
            problems.append(Problem("synchronizer.sync_method", why))
    return problems


def _sync_method_fits(config: RFTConfig) -> str | None:
    """Why the run's weight-sync method cannot send this run's policy, or None."""
    if "sync_method" not in config.synchronizer.model_fields_set:
        return None
    from services.weight_sync import sync_method

    method = sync_method(config.synchronizer.sync_method)
    if method.state_kind == "adapter" and not config.model.lora_configs:
        return (
            f"{config.synchronizer.sync_method!r} sends only a LoRA adapter, but model.lora_configs is "
            "empty; set model.lora_configs or use a method that sends the whole model (e.g. memory)"
        )
    return None


def check_names(config: RFTConfig, plugin_dirs: Sequence[str] = ()) -> list[Problem]:
    """Every name problem of `config` and of each of its stages, after loading `plugin_dirs`."""
    problems: list[Problem] = []
    try:
        load_plugin_dirs(plugin_dirs)
    except PluginError as exc:
        problems.append(Problem("plugin_dirs", str(exc)))
    base = _problems(config, runs=not config.stages)
    problems += base
    seen = {(p.path, p.message) for p in base}
    for prefix, stage in stage_configs(config):
        problems += [Problem(f"{prefix}.{p.path}", p.message) for p in _problems(stage, runs=True)
                     if (p.path, p.message) not in seen]  # fmt: skip
    return problems


def check_config(
    config: RFTConfig, config_file: str | os.PathLike[str], cli_plugin_dirs: Sequence[str] = ()
) -> tuple[RFTConfig, list[Problem]]:
    """`config` with its plug-in folders made absolute (the config's, relative to `config_file`'s folder,
    then `cli_plugin_dirs`), and every name problem (`check_names`)."""
    dirs = resolve_plugin_dirs(config.plugin_dirs, config_file, cli_plugin_dirs)
    config = config.model_copy(update={"plugin_dirs": dirs})
    return config, check_names(config, dirs)
