"""Plug-in folders (services/common/plugins.py): which modules are imported, where folders resolve,
the errors for a missing folder, a module that fails to import or is shadowed, and PYTHONPATH."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from services.common.plugins import (
    PluginError,
    load_plugin_dirs,
    plugin_modules,
    python_path,
    resolve_plugin_dirs,
)


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_every_module_and_package_is_imported_private_ones_are_not(tmp_path):
    (tmp_path / "plugins_test_flows.py").write_text("LOADED = True\nfrom plugins_test_helpers import VALUE\n")
    (tmp_path / "plugins_test_helpers.py").write_text("VALUE = 7\n")
    (tmp_path / "_plugins_test_private.py").write_text("raise RuntimeError('never imported')\n")
    (tmp_path / "notes.txt").write_text("not python\n")
    package = tmp_path / "plugins_test_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from plugins_test_pkg.inner import X\n")
    (package / "inner.py").write_text("X = 'inner'\n")
    (tmp_path / "plain_folder").mkdir()  # no __init__.py: not a package

    assert plugin_modules(tmp_path) == ["plugins_test_flows", "plugins_test_helpers", "plugins_test_pkg"]
    assert load_plugin_dirs([str(tmp_path)]) == plugin_modules(tmp_path)
    assert sys.modules["plugins_test_flows"].LOADED and sys.modules["plugins_test_pkg"].X == "inner"
    assert sys.path[0] == str(tmp_path.resolve())
    assert "_plugins_test_private" not in sys.modules
    load_plugin_dirs([str(tmp_path)])  # again: nothing is imported twice, sys.path keeps one entry
    assert sys.path.count(str(tmp_path.resolve())) == 1


def test_a_module_that_fails_to_import_names_the_module_folder_and_error(tmp_path):
    (tmp_path / "plugins_test_broken.py").write_text(textwrap.dedent("""
        import plugins_test_no_such_dependency
    """))  # fmt: skip
    with pytest.raises(PluginError) as err:
        load_plugin_dirs([tmp_path])
    text = str(err.value)
    assert "plugins_test_broken" in text and str(tmp_path) in text
    assert "ModuleNotFoundError: No module named 'plugins_test_no_such_dependency'" in text

    (tmp_path / "plugins_test_broken.py").write_text("def f(:\n")
    with pytest.raises(PluginError, match="SyntaxError"):
        load_plugin_dirs([tmp_path])


def test_missing_folder_file_instead_of_folder_bad_name_and_shadowing(tmp_path):
    with pytest.raises(PluginError, match="does not exist"):
        load_plugin_dirs([tmp_path / "nowhere"])
    (tmp_path / "file.py").write_text("")
    with pytest.raises(PluginError, match="is not a folder"):
        load_plugin_dirs([tmp_path / "file.py"])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "my-plugin.py").write_text("")
    with pytest.raises(PluginError, match="not a Python module name"):
        load_plugin_dirs([bad])
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "json.py").write_text("")  # `json` is imported already, from the standard library
    with pytest.raises(PluginError, match="shadowed by"):
        load_plugin_dirs([shadow])


def test_config_folders_follow_the_config_file_command_line_ones_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    monkeypatch.chdir(tmp_path)
    dirs = resolve_plugin_dirs(
        ["plugs", "/abs/x", "plugs"], tmp_path / "conf" / "run.yaml", ["cli", "/abs/x"]
    )
    assert dirs == [str(tmp_path / "conf" / "plugs"), "/abs/x", str(tmp_path / "cli")]
    assert resolve_plugin_dirs([], tmp_path / "conf" / "run.yaml") == []


def test_python_path_puts_the_folders_first_once():
    env = {"PYTHONPATH": os.pathsep.join(["/repo", "/a"])}
    assert python_path(["/a", "/b"], env) == os.pathsep.join(["/a", "/b", "/repo"])
    assert python_path(["/a"], {}) == "/a"
