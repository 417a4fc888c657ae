"""SamplingParams: built once from the config, derived per call with `replace`, refused by field name."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.config import load_config, resolve
from services.common.sampling import SamplingParams

CONFIG = """
model:
  model_path: /m
  temperature: 0.7
  top_p: 0.9
  top_k: 20
  max_response_tokens: 64
  min_response_tokens: 2
  repetition_penalty: 1.1
explorer: {rollout_model: {ignore_eos: true}}
buffer:
  batch_size: 2
  explorer_input:
    tasksets:
      - {name: plain, path: a.jsonl}
      - {name: own, path: b.jsonl, rollout_args: {temperature: 0.0, top_k: 0, max_tokens: 8, stop: ["\\n\\n"]}}
"""


@pytest.fixture
def resolved():
    return resolve(load_config(text=CONFIG))


def test_a_taskset_inherits_the_model_section(resolved):
    p = resolved.sampling_params(resolved.tasksets[0])
    assert p == SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, max_tokens=64, min_tokens=2, repetition_penalty=1.1,
        ignore_eos=True, logprobs=0, stop=(), n=1,
    )  # fmt: skip


def test_a_tasksets_own_rollout_args_win(resolved):
    p = resolved.sampling_params(resolved.tasksets[1])
    assert (p.temperature, p.top_k, p.max_tokens, p.stop) == (0.0, -1, 8, ("\n\n",))
    assert (p.top_p, p.min_tokens, p.repetition_penalty) == (0.9, 2, 1.1)  # not set there: model.*


def test_without_a_taskset_the_model_section_alone(resolved):
    assert resolved.sampling_params().max_tokens == 64
    assert resolved.sampling_params(max_tokens=5, n=3) == resolved.sampling_params().replace(
        max_tokens=5, n=3
    )


def test_no_token_limit_anywhere_is_an_error_naming_the_keys():
    bare = resolve(load_config(text="model: {model_path: /m}"))
    with pytest.raises(
        ValueError, match=r"SamplingParams\.max_tokens: required; set model\.max_response_tokens"
    ):
        bare.sampling_params()
    assert bare.sampling_params(max_tokens=3).max_tokens == 3  # an explicit limit needs no config one


def test_replace_returns_a_validated_copy_and_keeps_the_original(resolved):
    base = resolved.sampling_params(resolved.tasksets[0])
    greedy = base.replace(temperature=0.0, n=4)
    assert (greedy.temperature, greedy.n, greedy.max_tokens) == (0.0, 4, 64)
    assert (base.temperature, base.n) == (0.7, 1)
    assert base.replace() is base
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.temperature = 0.1  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"SamplingParams\.n: must be >= 1, got 0"):
        base.replace(n=0)


def test_an_unknown_field_is_refused_with_the_closest_name(resolved):
    base = resolved.sampling_params()
    with pytest.raises(ValueError, match="no field 'temprature'; did you mean 'temperature'"):
        base.replace(temprature=0.5)
    with pytest.raises(ValueError, match="no field 'beam_width'; known: temperature, top_p"):
        base.replace(beam_width=2)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.1, r"temperature: must be >= 0.0, got -0.1 \(0 samples greedily\)"),
        ("top_p", 0.0, r"top_p: must be > 0.0 and <= 1.0, got 0.0"),
        ("top_p", 1.5, r"top_p: must be > 0.0 and <= 1.0, got 1.5"),
        ("top_k", 2.5, r"top_k: must be an integer, got 2.5"),
        ("max_tokens", 0, r"max_tokens: must be >= 1, got 0"),
        ("max_tokens", True, r"max_tokens: must be an integer, got True"),
        ("min_tokens", -1, r"min_tokens: must be >= 0, got -1"),
        ("repetition_penalty", 0, r"repetition_penalty: must be > 0.0, got 0"),
        ("temperature", "hot", r"temperature: must be a number, got 'hot'"),
        ("ignore_eos", 1, r"ignore_eos: must be true or false, got 1"),
        ("stop", "###", r"stop: must be a list of str, got '###'"),
        ("stop_token_ids", [1, "2"], r"stop_token_ids: every item must be a int, got '2'"),
    ],
)
def test_bad_values_name_the_field(resolved, field, value, message):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{message}"):
        resolved.sampling_params().replace(**{field: value})


def test_lists_become_tuples_and_any_top_k_off_is_minus_one(resolved):
    p = resolved.sampling_params().replace(stop=["a", "b"], stop_token_ids=[7], top_k=0)
    assert (p.stop, p.stop_token_ids, p.top_k) == (("a", "b"), (7,), -1)
    assert hash(p) == hash(resolved.sampling_params().replace(stop=("a", "b"), stop_token_ids=(7,), top_k=-5))
