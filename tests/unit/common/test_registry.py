"""Registry: names, aliases, dotted-path plug-ins and helpful errors."""

from __future__ import annotations

import pytest

from services.common.registry import Registry, RegistryError, import_object


def test_register_alias_and_plugin():
    reg: Registry[object] = Registry("workflow")

    @reg.register("math", "math_single")
    class Math:
        pass

    assert reg.get("math") is Math and reg.get("math_single") is Math
    assert reg.canonical_name("math_single") == "math"
    assert reg.get("collections:OrderedDict").__name__ == "OrderedDict"
    assert "math_single" in reg and reg.names() == ["math"]
    assert reg.names(include_aliases=True) == ["math", "math_single"]


def test_unknown_name_suggests_and_lists():
    reg: Registry[object] = Registry("reward")
    reg.add("gsm8k", object())
    with pytest.raises(RegistryError, match=r"unknown reward 'gsm8kk'; known: gsm8k; did you mean 'gsm8k'\?"):
        reg.get("gsm8kk")


def test_bad_plugins_are_clear():
    with pytest.raises(ImportError, match="cannot import module 'no_such_pkg_xyz.mod'"):
        import_object("no_such_pkg_xyz.mod:Thing")
    with pytest.raises(ImportError, match="has no attribute"):
        import_object("collections:NoSuchThing")
    with pytest.raises(ImportError, match="must look like"):
        import_object("collections.OrderedDict")


def test_double_registration_refused():
    reg: Registry[object] = Registry("engine")
    reg.add("hf", 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.add("hf", 2)
