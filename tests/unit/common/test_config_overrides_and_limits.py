"""Loading: twin keys resolve to one value, the response-token limit is explicit, `--set` reaches
list items (stages) and fails as a ConfigError, and an environment override names its variable."""

from __future__ import annotations

import pytest

from services.common.config import ConfigError, load_config, resolve

TASKSET = "buffer: {explorer_input: {taskset: {path: t.jsonl}}}\n"


def _problems(text: str, **kw) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(text=text, **kw)
    return [str(p) for p in err.value.problems]


def test_rollout_model_twins_resolve_to_one_value_and_reach_the_engine_config():
    config = load_config(
        text=TASKSET
        + "explorer: {rollout_model: {max_response_tokens: 12, max_prompt_tokens: 20, enable_thinking: false, "
        "chat_template: '{{ x }}'}}"
    )
    r = resolve(config)
    assert (r.max_response_tokens, r.max_prompt_tokens, r.max_model_len) == (12, 20, 32)
    assert r.enable_thinking is False and r.chat_template == "{{ x }}"
    assert r.sampling_params(r.tasksets[0]).max_tokens == 12
    engine = r.rollout_model
    assert (engine.max_model_len, engine.max_prompt_tokens, engine.max_response_tokens) == (32, 20, 12)


def test_twins_that_disagree_are_refused_naming_both():
    lines = _problems(
        "model: {max_response_tokens: 8, custom_chat_template: a}\n"
        "explorer: {rollout_model: {max_response_tokens: 9, chat_template: b}}"
    )
    assert any(
        line.startswith(
            "explorer.rollout_model.max_response_tokens: 9 differs from model.max_response_tokens (8)"
        )
        for line in lines
    )
    assert any(
        line.startswith("explorer.rollout_model.chat_template: 'b' differs from model.custom_chat_template")
        for line in lines
    )
    load_config(text="model: {max_response_tokens: 8}\nexplorer: {rollout_model: {max_response_tokens: 8}}")


def test_the_response_limit_is_derived_from_the_model_length():
    r = resolve(load_config(text=TASKSET + "model: {max_model_len: 100, max_prompt_tokens: 60}"))
    assert r.max_response_tokens == 40 and r.sampling_params(r.tasksets[0]).max_tokens == 40


def test_no_derivable_limit_is_refused_with_a_suggestion():
    (line,) = _problems(TASKSET)
    assert line.startswith("model.max_response_tokens: not set and no limit can be derived")
    assert "set model.max_response_tokens" in line
    # a taskset's own limit, a train-only run, or a train stage need none
    load_config(text="buffer: {explorer_input: {taskset: {path: t.jsonl, rollout_args: {max_tokens: 5}}}}")
    load_config(text="mode: train\n" + TASKSET)
    lines = _problems(TASKSET + "stages: [{stage_name: sft, mode: train}, {stage_name: rl}]")
    assert lines == [lines[0]] and lines[0].startswith("stages[1].model.max_response_tokens")


def test_set_reaches_a_stage_by_index():
    text = (
        TASKSET
        + "model: {max_response_tokens: 4}\nstages: [{stage_name: a, buffer: {batch_size: 2}}, {stage_name: b}]"
    )
    config = load_config(text=text, overrides=["stages.0.buffer.total_steps=12", "stages.1.mode=train"])
    assert config.stages[0].buffer == {"batch_size": 2, "total_steps": 12}
    assert config.stages[1].mode == "train"


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("stages.3.buffer.total_steps=12", "stages is a list of 1 item(s)"),
        ("stages.x.buffer=1", "'x' is not an index"),
        ("buffer..batch_size=3", "override must look like key.path=value"),
        ("nothing", "override must look like key.path=value"),
        ("stages.0.stage_name.deeper=1", "is a value, not a section"),
    ],
)
def test_a_bad_set_is_a_config_error(override, fragment):
    (line,) = _problems("stages: [{stage_name: a}]", overrides=[override])
    assert line.startswith(f"--set {override}: ") and fragment in line


def test_a_set_value_of_the_wrong_type_names_the_key():
    (line,) = _problems("{}", overrides=["buffer.batch_size=abc"])
    assert line.startswith("buffer.batch_size: 'abc'")


def test_an_environment_override_names_its_variable():
    (line,) = _problems("{}", environ={"RFT_BUFFER_PORT": "abc"})
    assert line.startswith("services.buffer.port: 'abc'") and "environment variable RFT_BUFFER_PORT" in line
