"""`rft convert-verl`: a veRL launch script -> RFT Mesh run configs, one per `main_ppo` command.

Order of work for one command: the rules that read several keys (rules_training.py, rules_run.py),
then the one-to-one table (table.DIRECT, with veRL's defaults where they differ from this project's,
except those a rule writes itself: table.RULE_DEFAULTS), then veRL keys the trainer reads under
`trainer.trainer_config` (compat.TRAINER_CONFIG_KEYS), then every key left over becomes a
`# veRL key=value: no equivalent (reason)` comment and a warning. Last, the tree is checked with the
same loader `rft run` uses; a value it refuses is turned into such a comment with the loader's reason,
so what is written always loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from launcher.convert_verl.draft import Draft, render
from launcher.convert_verl.overrides import parse_override
from launcher.convert_verl.rules_run import RUN_RULES
from launcher.convert_verl.rules_training import TRAINING_RULES
from launcher.convert_verl.shell import VerlCommand, verl_commands
from launcher.convert_verl.table import DIRECT, RULE_DEFAULTS, VERL_DEFAULTS, no_equivalent
from services.common.config import ConfigError, validate_tree
from services.common.config.compat import TRAINER_CONFIG_KEYS
from services.common.config.loader import config_warnings


class NoVerlCommandError(ValueError):
    """The script holds no `verl.trainer.main_ppo` command."""


class ConversionError(ValueError):
    """The converted tree does not load for a reason no single veRL key explains."""


@dataclass
class Conversion:
    """One converted command: the YAML text, the tree it holds, and what the user should know."""

    line: int
    yaml: str
    tree: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _direct(d: Draft) -> None:
    for key, rule in DIRECT.items():
        if key in d.used or not (d.has(key) or (key in VERL_DEFAULTS and key not in RULE_DEFAULTS)):
            continue
        value = d.get(key, VERL_DEFAULTS.get(key))
        note = d.source_or_default(key, value)
        d.set(rule.target, rule.transform(value) if rule.transform else value, note, (key,))


def _trainer_config(d: Draft) -> None:
    for key in d.unused():
        if key in TRAINER_CONFIG_KEYS:
            d.set(("trainer", "trainer_config", *key.split(".")), d.get(key), keys=(key,))


def _leftovers(d: Draft) -> None:
    for key in d.unused():
        ne = no_equivalent(key)
        same = ne.same is not None and d.args[key].value == ne.same
        d.drop(key, ne.reason, warn=not same, same=same)


def _path(text: str) -> tuple[str | int, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", text))


def _owner(d: Draft, path_text: str) -> tuple[str | int, ...] | None:
    """The set path at or above `path_text` that came from veRL keys, if any."""
    path = _path(path_text)
    return next((path[:n] for n in range(len(path), 0, -1) if d.origin.get(path[:n])), None)


def _settle(d: Draft) -> None:
    """Load the tree as `rft run` would; a value it refuses, or that it says has no effect here, goes
    back to its veRL keys as a no-equivalent comment with the loader's reason, until the tree is clean."""
    for _ in range(50):
        try:
            config = validate_tree(d.ordered_tree(), "<converted>")
        except ConfigError as exc:
            for problem in exc.problems:
                owner = _owner(d, problem.path)
                if owner is None:
                    raise ConversionError(f"the converted config does not load: {problem}") from None
                keys = d.origin[owner]
                d.unset(owner)
                for key in keys:
                    d.drop(key, problem.message)
            continue
        idle = [(line, _owner(d, line.split(":", 1)[0])) for line in config_warnings(config)]
        if not any(owner for _, owner in idle):
            d.warnings += [line for line, _ in idle]
            return
        for line, owner in idle:
            if owner is not None and owner in d.origin:
                keys = d.origin[owner]
                d.unset(owner)
                for key in keys:
                    d.drop(key, line.split(": ", 1)[1] if ": " in line else line)
    raise ConversionError("the converted config does not settle")


def convert_command(cmd: VerlCommand, source: str = "<script>") -> Conversion:
    parsed = [(arg, parse_override(arg)) for arg in cmd.args]
    d = Draft([o for _, o in parsed if o is not None])
    for arg, o in parsed:
        if o is None:
            d.warn(f"argument {arg!r} is not a key=value override; ignored")
    for note in cmd.notes:
        d.note(note)
    for rule in TRAINING_RULES + RUN_RULES:
        rule(d)
    _direct(d)
    _trainer_config(d)
    _leftovers(d)
    _settle(d)
    header = [
        f"# Run config converted from the veRL command at {source}:{cmd.line} by `rft convert-verl`.",
        "# Check it with `rft config show FILE`; run it with `rft run --config FILE`.",
    ]
    header += [f"# note: {n}" for n in d.notes]
    header += [
        f"# veRL {k}={t}: {'nothing to set' if same else 'no equivalent'} ({r})"
        for k, t, r, same in d.dropped
    ]
    tree = d.ordered_tree()
    return Conversion(cmd.line, render(tree, d.comments, header), tree, list(d.warnings), list(d.notes))


def convert_script(text: str, source: str = "<script>") -> list[Conversion]:
    """Every veRL command of a shell script (or a bare command line), converted."""
    commands = verl_commands(text)
    if not commands:
        raise NoVerlCommandError(
            f"{source}: no veRL command found; expected a line like "
            "`python3 -m verl.trainer.main_ppo data.train_batch_size=8 ...`"
        )
    return [convert_command(c, source) for c in commands]
