"""Plug-in directories (Trinity-RFT's `--plugin-dir`): user code that lives outside this package.

A run names its plug-in folders in the root config key `plugin_dirs` (relative folders resolve
against the config file's folder) and on the command line (`rft run|serve|config check --plugin-dir
DIR`, relative to the working directory). Every service, and `rft run` itself before it starts any,
puts each folder first on `sys.path` (the children of `rft run` also get it on `PYTHONPATH`) and
imports every module in it: each `*.py` file and each package folder (with `__init__.py`) whose name
does not start with `_` or `.`. So registration decorators run (`@WORKFLOWS.register("my_flow")`
makes `default_workflow_type: my_flow` a known name) and `my_module:MyWorkflow` plug-in paths
resolve. A folder that does not exist, or a module that fails to import, is a `PluginError` naming
the folder or file and the module's own exception: never a warning that surfaces later.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["PluginError", "load_plugin_dirs", "plugin_modules", "python_path", "resolve_plugin_dirs"]


class PluginError(ImportError):
    """A plug-in folder that is missing, or one of its modules that cannot be imported."""


def resolve_plugin_dirs(
    config_dirs: Iterable[str],
    config_file: str | os.PathLike[str] | None = None,
    cli_dirs: Iterable[str] = (),
) -> list[str]:
    """Absolute plug-in folders, without repeats: the config's (relative to `config_file`'s folder)
    then the command line's (relative to the working directory)."""
    base = Path(config_file).resolve().parent if config_file is not None else Path.cwd()
    out: list[str] = []
    for folder in [base / Path(d).expanduser() for d in config_dirs] + [
        Path(d).expanduser().resolve() for d in cli_dirs
    ]:
        text = str(folder.resolve())
        if text not in out:
            out.append(text)
    return out


def plugin_modules(folder: Path) -> list[str]:
    """The module names a plug-in folder holds: `*.py` files and package folders, sorted."""
    names = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(("_", ".")):
            continue
        if entry.is_file() and entry.suffix == ".py":
            names.append(entry.stem)
        elif entry.is_dir() and (entry / "__init__.py").is_file():
            names.append(entry.name)
    return names


def _check_folder(folder: Path) -> None:
    if not folder.exists():
        raise PluginError(f"plug-in folder {str(folder)!r} does not exist (plugin_dirs / --plugin-dir)")
    if not folder.is_dir():
        raise PluginError(f"plug-in folder {str(folder)!r} is not a folder (plugin_dirs / --plugin-dir)")


def _import(name: str, folder: Path) -> None:
    if not name.isidentifier():
        raise PluginError(
            f"plug-in module {str(folder / name)!r}: {name!r} is not a Python module name; "
            "rename it to letters, digits and '_'"
        )
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # the module's own error, whatever it is, names the file
        raise PluginError(
            f"plug-in module {name!r} in {str(folder)!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    where = getattr(module, "__file__", None) or ""
    if where and folder not in Path(where).resolve().parents:
        raise PluginError(
            f"plug-in module {name!r} in {str(folder)!r} is shadowed by {where!r}, imported first; "
            "rename the plug-in module"
        )


def load_plugin_dirs(dirs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Put each folder first on `sys.path` and import its modules; returns the module names.

    Idempotent: a module already imported from its folder is not imported again."""
    folders = [Path(d).resolve() for d in dirs]
    for folder in folders:
        _check_folder(folder)
    for folder in reversed(folders):  # the first folder ends up first on sys.path
        if str(folder) in sys.path:
            sys.path.remove(str(folder))
        sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    loaded = []
    for folder in folders:
        for name in plugin_modules(folder):
            _import(name, folder)
            loaded.append(name)
    return loaded


def python_path(dirs: Sequence[str], environ: Mapping[str, str]) -> str:
    """`PYTHONPATH` for a child process: the plug-in folders before what `environ` already has."""
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in dirs]
    return os.pathsep.join([*dirs, *rest])
