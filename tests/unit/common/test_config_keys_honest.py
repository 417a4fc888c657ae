"""Every key of the config tree does what it says, or says it does not.

The walk visits every leaf field of `RFTConfig`, recursively through nested sections and through
lists, tuples, dicts and optionals of sections. A leaf passes when it is

- read by code: its name occurs in the Python source of `services/` or `launcher/` (`rft run` reads
  what it does itself: stages, the offline data it feeds a train stage) outside the section definitions,
  as an attribute access (`.name` in the token stream: `config.model.temperature`, `m.temperature`)
  or as a string literal equal to the name (`getattr(alg, "advantage_fn")`, `extra.get("seed")`,
  `tree["model"]["model_path"]` after `model_dump`). Comments and docstrings do not count (the source
  is tokenized). `services/common/config/resolved.py`, `gpus.py` and `sync_plan.py` count as readers: they are the
  derived views the services read (`resolve(config).job_dir` reads `checkpoint_root_dir`). The
  modules that define sections, the loader and `compat.py` do not;
- or listed in `compat.REFUSED` (refused at load when set) or `compat.WARNED` (a warning when set),
  each with its reason.

The heuristic is a necessary condition, not a proof: a name that no reader mentions surely does
nothing, but a name shared with another object (e.g. `seed`) passes whenever any reader uses it.
The twins of `model.*` in `explorer.rollout_model` are read through `Resolved.rollout_model` and
checked by their own tests. The walker is checked to fail on a field nobody reads.
"""

from __future__ import annotations

import io
import tokenize
import types
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from services.common.config import RFTConfig, load_config
from services.common.config.base import Section
from services.common.config.compat import REFUSED, TRAINER_CONFIG_KEYS, TRAINER_CONFIG_MOVED, WARNED
from services.common.config.loader import config_warnings

ROOT = Path(__file__).resolve().parents[3]
CONFIG_PACKAGE = ROOT / "services/common/config"
READER_MODULES_IN_CONFIG = {"resolved.py", "gpus.py", "sync_plan.py"}


def _sections_in(tp: typing.Any) -> list[type[BaseModel]]:
    """The section classes inside an annotation (Optional, Union, list, tuple, dict values)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, list, tuple, dict, typing.Annotated):
        args = typing.get_args(tp)
        if origin is dict:
            args = args[1:]
        elif origin is typing.Annotated:
            args = args[:1]
        return [s for a in args for s in _sections_in(a)]
    return [tp] if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type[BaseModel], str]]:
    """(path, owning section class, field name) of every leaf field under `model`."""
    for name, field in model.model_fields.items():
        sections = _sections_in(field.annotation)
        if sections:
            for section in sections:
                yield from leaves(section, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", model, name


@cache
def read_names() -> frozenset[str]:
    """Names used as attributes or as exact string literals by the readers of the config."""
    names: set[str] = set()
    for path in sorted([*(ROOT / "services").rglob("*.py"), *(ROOT / "launcher").rglob("*.py")]):
        if path.parent == CONFIG_PACKAGE and path.name not in READER_MODULES_IN_CONFIG:
            continue
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
        for prev, tok in zip(tokens, tokens[1:], strict=False):
            if tok.type == tokenize.NAME and prev.type == tokenize.OP and prev.string == ".":
                names.add(tok.string)
            elif tok.type == tokenize.STRING and prev.type != tokenize.INDENT:
                text = tok.string.strip("rbuRBU")
                if (
                    len(text) >= 2
                    and text[0] == text[-1]
                    and text[0] in "'\""
                    and not text.startswith(text[0] * 3)
                ):
                    names.add(text[1:-1])
    return frozenset(names)


def _listed(cls: type[BaseModel], name: str) -> bool:
    return any((klass, name) in REFUSED or (klass, name) in WARNED for klass in cls.__mro__)


def silent_keys(model: type[BaseModel]) -> list[str]:
    """Leaf paths that nothing reads and no list explains."""
    names = read_names()
    return [path for path, cls, name in leaves(model) if name not in names and not _listed(cls, name)]


def test_every_key_of_the_tree_is_read_refused_or_warned():
    walked = list(leaves(RFTConfig))
    assert len(walked) > 250  # the walk reaches the nested sections
    assert any(p == "buffer.explorer_input.tasksets.format.prompt_key" for p, _, _ in walked)
    assert any(p == "explorer.auxiliary_models.engine_type" for p, _, _ in walked)
    assert any(p == "buffer.trainer_input.auxiliary_buffers.replay_buffer.enable" for p, _, _ in walked)
    assert silent_keys(RFTConfig) == []


class _Probe(Section):
    temperature: float = 1.0  # read all over the services
    zz_never_read_by_anything: int = 0


class _ProbeRoot(Section):
    inner: list[_Probe] = []
    by_name: dict[str, _Probe] = {}
    maybe: _Probe | None = None


def test_the_walker_reports_a_field_nobody_reads():
    assert silent_keys(_ProbeRoot) == [
        "inner.zz_never_read_by_anything",
        "by_name.zz_never_read_by_anything",
        "maybe.zz_never_read_by_anything",
    ]


def test_the_readers_exclude_comments_and_docstrings():
    names = read_names()
    assert "temperature" in names and "advantage_fn" in names  # attribute and getattr string
    assert "zz_never_read_by_anything" not in names


def test_every_listed_key_is_a_field_with_a_reason():
    for table in (REFUSED, WARNED):
        for (cls, name), rule in table.items():
            assert name in cls.model_fields, f"{cls.__name__}.{name}"
            assert rule.reason


@pytest.mark.parametrize(
    "text,path,instead",
    [
        ("algorithm: {optimizer: {clip_grad: 0.5}}", "algorithm.optimizer.clip_grad", "trainer.grad_clip"),
        ("algorithm: {sample_strategy: mix}", "algorithm.sample_strategy", "staleness_control"),
        ("explorer: {env_vars: {A: b}}", "explorer.env_vars", "environment of `rft run`"),
        ("model: {rope_theta: 5.0}", "model.rope_theta", "config.json"),
        ("trainer: {ulysses_sequence_parallel_size: 2}", "trainer.ulysses_sequence_parallel_size", ""),
        (
            "buffer: {explorer_input: {tasksets: [{path: a, format: {image_key: img}}]}}",
            "buffer.explorer_input.tasksets[0].format.image_key",
            "",
        ),
        (
            "trainer: {trainer_config: {actor_rollout_ref: {actor: {ppo_epochs: 2}}}}",
            "trainer.trainer_config.actor_rollout_ref.actor.ppo_epochs",
            "algorithm.ppo_epochs",
        ),
    ],
)
def test_a_refused_key_is_an_error_naming_the_path_and_the_alternative(text, path, instead):
    from services.common.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(text=text + "\nmodel: {max_response_tokens: 4}" if "model:" not in text else text)
    line = next(str(p) for p in err.value.problems if p.path == path)
    assert "not supported" in line or "not read here" in line
    assert instead in line


def test_a_refused_key_at_its_default_loads():
    load_config(text="algorithm: {optimizer: {clip_grad: 1.0}, sample_strategy: default}")


def test_warned_keys_load_and_say_so_with_their_path():
    config = load_config(
        text="""
explorer:
  concurrent_mode: multi-threading
  rollout_model: {use_v1: false, enforce_eager: true}
trainer:
  trainer_type: verl
  trainer_config: {critic: {model: {fsdp_config: {param_offload: true}}}}
stages:
  - stage_name: a
    explorer: {max_repeat_times_per_runner: 2}
"""
    )
    lines = config_warnings(config)
    for fragment in (
        "explorer.concurrent_mode: 'multi-threading' has no effect here",
        "explorer.rollout_model.use_v1: False has no effect here",
        "explorer.rollout_model.enforce_eager: True has no effect here: a vLLM engine setting",
        "trainer.trainer_type: 'verl' has no effect here",
        "trainer.trainer_config.critic.model.fsdp_config.param_offload: not read by this trainer",
        "stages[0].explorer.max_repeat_times_per_runner: 2 has no effect here",
    ):
        assert any(line.startswith(fragment) for line in lines), (fragment, lines)
    assert not any(line.startswith("stages[0].explorer.concurrent_mode") for line in lines)  # said once
    assert (
        config_warnings(
            load_config(text="explorer: {rollout_model: {engine_type: vllm, enforce_eager: true}}")
        )
        == []
    )


def test_every_trainer_config_key_said_to_be_read_is_read_by_the_trainer():
    source = (ROOT / "services/trainer/settings.py").read_text()
    assert [key for key in sorted(TRAINER_CONFIG_KEYS) if f'"{key}"' not in source] == []


def test_every_moved_trainer_config_key_points_at_a_key_of_the_tree():
    paths = {path for path, _, _ in leaves(RFTConfig)}
    for target in TRAINER_CONFIG_MOVED.values():
        assert any(p == target or target.startswith(p + ".") for p in paths), target
