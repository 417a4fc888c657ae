"""Every service package reads the run config the same way: `services/<s>/settings.py` defines one
frozen `<S>Settings` record with a `from_config(config)` classmethod, the service entry builds it once
and the core takes it (its `settings` argument), never the whole `RFTConfig`."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

from services.common.config import load_config

# service -> (core module, core class, a config override, the record field it sets, expected value)
SERVICES = {
    "buffer": ("core", "BufferCore", "services.buffer.lease_ms=1234", "lease_ms", 1234),
    "explorer": ("core", "ExplorerCore", "buffer.total_steps=7", "total_steps", 7),
    "synchronizer": ("core", "SynchronizerCore", "synchronizer.sync_timeout=12", "sync_timeout", 12.0),
    "trainer": ("core", "TrainerCore", "trainer.save_interval=5", "save_interval", 5),
}


def _settings_class(service: str) -> type:
    module = importlib.import_module(f"services.{service}.settings")
    name = f"{service.capitalize()}Settings"
    cls = getattr(module, name, None)
    assert cls is not None, f"services/{service}/settings.py defines no {name}"
    return cls


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_settings_is_a_frozen_record_with_from_config(service):
    cls = _settings_class(service)
    assert dataclasses.is_dataclass(cls), f"{cls.__name__} is not a dataclass"
    assert cls.__dataclass_params__.frozen, f"{cls.__name__} is not frozen (@dataclass(frozen=True))"
    assert isinstance(inspect.getattr_static(cls, "from_config"), classmethod), (
        f"{cls.__name__}.from_config is not a classmethod"
    )
    first = list(inspect.signature(cls.from_config).parameters)[0]
    assert first == "config", (
        f"{cls.__name__}.from_config takes the RFTConfig first (as `config`), not {first!r}"
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_from_config_builds_the_record_from_a_minimal_config(service):
    cls = _settings_class(service)
    _, _, override, name, expected = SERVICES[service]
    settings = cls.from_config(load_config(text="", overrides=[override]))
    assert isinstance(settings, cls)
    assert getattr(settings, name) == expected, f"{override} did not reach {cls.__name__}.{name}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settings, name, expected)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_core_takes_the_record(service):
    module_name, core_name, *_ = SERVICES[service]
    core = getattr(importlib.import_module(f"services.{service}.{module_name}"), core_name)
    params = inspect.signature(core.__init__).parameters
    assert "settings" in params, f"{core_name}.__init__ takes no `settings`"
    annotation = str(params["settings"].annotation)
    assert _settings_class(service).__name__ in annotation, (
        f"{core_name}.__init__(settings: {annotation}) should take {_settings_class(service).__name__}"
    )
    assert "config" not in params, f"{core_name}.__init__ should not take the whole config"
