"""Config: the two seed examples load unchanged; bad files fail with path, value and suggestion."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import ConfigError, load_config, resolve

ROOT = Path(__file__).resolve().parents[3]
SEEDS = ROOT / "examples" / "verl_mapping"


def test_seed_ppo_example_resolves_batch_sizes():
    config = load_config(SEEDS / "ppo_example.yaml", environ={})
    r = resolve(config)
    assert config.algorithm.algorithm_type == "ppo"
    assert config.buffer.batch_size == 256
    assert r.train_batch_size == 256  # ppo_mini_batch_size * rollout.n = 256 * 1
    assert config.synchronizer.sync_interval == 4
    assert config.algorithm.optimizer.lr == pytest.approx(1e-6)
    assert config.trainer.trainer_config["critic"]["optim"]["lr"] == pytest.approx(1e-5)
    assert [t.name for t in r.tasksets] == ["gsm8k", "math"]
    assert r.sampling_params(r.tasksets[1]).temperature == 1.0
    assert r.gpu_split == {"total": 8, "rollout": 2, "auxiliary": 2, "trainer": 4}
    assert config.model.model_path.endswith("/models/Qwen2-7B-Instruct")
    assert not config.model.model_path.startswith("$")  # ${oc.env:HOME} resolved


def test_seed_grpo_example_resolves_batch_sizes():
    config = load_config(SEEDS / "grpo_example.yaml")
    r = resolve(config)
    assert config.algorithm.repeat_times == 8
    assert config.buffer.batch_size == 256
    assert r.train_batch_size == 2048  # 256 * 8
    assert r.experiences_per_explore_step == 2048
    assert config.algorithm.kl_loss_fn == "low_var_kl"
    assert config.algorithm.kl_loss_fn_args == {"kl_coef": 0.001}
    assert r.max_token_len_per_gpu == 24000
    assert r.gpu_split["trainer"] == 6
    assert r.explorer_run_name.endswith("_explorer") and r.trainer_run_name.endswith("_trainer")


def test_train_batch_size_defaults_to_batch_times_repeat():
    config = load_config(text="algorithm: {algorithm_type: grpo, repeat_times: 4}\nbuffer: {batch_size: 3}\n")
    assert resolve(config).train_batch_size == 12
    assert config.buffer.train_batch_size == 0  # derived values are never written back


def _error(text: str, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_config(text=text, **kw)
    return err.value


def test_unknown_nested_key_names_path_and_suggests():
    err = _error(
        "buffer:\n  explorer_input:\n    tasksets:\n      - name: a\n        format:\n          prompt_kye: question\n"
    )
    assert [str(p) for p in err.problems] == [
        "buffer.explorer_input.tasksets[0].format.prompt_kye: unknown key (value 'question'); "
        "did you mean `prompt_key`?"
    ]


def test_misspelt_section_key_suggests_close_match():
    err = _error("synchronizer:\n  sync_intervall: 2\n")
    assert (
        str(err.problems[0])
        == "synchronizer.sync_intervall: unknown key (value 2); did you mean `sync_interval`?"
    )


def test_bad_choice_lists_allowed_values():
    err = _error("synchronizer:\n  sync_style: fixd\n")
    assert str(err.problems[0]) == (
        "synchronizer.sync_style: 'fixd' is not allowed; allowed: 'fixed', 'explorer_driven', "
        "'trainer_driven', 'fully_async'; did you mean `fixed`?"
    )


def test_bad_type_and_range_name_value():
    err = _error("algorithm:\n  repeat_times: eight\nbuffer:\n  batch_size: 0\n")
    texts = [str(p) for p in err.problems]
    assert texts[0].startswith("algorithm.repeat_times: 'eight': Input should be a valid integer")
    assert texts[1] == "buffer.batch_size: 0: Input should be greater than or equal to 1"


def test_unknown_top_level_section():
    err = _error("synchroniser:\n  sync_interval: 2\n")
    assert str(err.problems[0]).startswith("synchroniser: unknown key")
    assert "did you mean `synchronizer`?" in str(err.problems[0])


def test_cross_section_rule_suggests_fix():
    err = _error("algorithm: {repeat_times: 8}\nbuffer: {batch_size: 4, train_batch_size: 30}\n")
    assert "must be a multiple of algorithm.repeat_times (8)" in str(err)
    assert "try 24" in str(err)


def test_aliases_normalised():
    """Style aliases normalise at load; a method alias is resolved by the one method registry into the
    typed method each service's settings record holds (services/weight_sync/method.py)."""
    from services.synchronizer.settings import SynchronizerSettings

    config = load_config(text="synchronizer: {sync_method: online, sync_style: dynamic_by_explorer}\n")
    assert config.synchronizer.sync_style == "explorer_driven"
    settings = SynchronizerSettings.from_config(config)
    assert settings.method.name == "nccl" and settings.plan.style == "explorer_driven"
    assert settings.tree_fanout == 0  # the fan-out tree is for pushed methods only


def test_the_tree_fanout_is_decided_once_for_both_settings_records():
    from services.explorer.settings import ExplorerSettings
    from services.synchronizer.settings import SynchronizerSettings

    for method, fanout, tree in (("memory", 2, 2), ("memory", 0, 0), ("nccl", 2, 0), ("checkpoint", 3, 0)):
        config = load_config(text=f"synchronizer: {{sync_method: {method}, fanout: {fanout}}}\n")
        assert SynchronizerSettings.from_config(config).tree_fanout == tree, (method, fanout)
        assert ExplorerSettings.from_config(config).relay_fanout == tree, (method, fanout)


def test_env_interpolation_and_missing_variable():
    config = load_config(text="model: {model_path: '${oc.env:RFT_TEST_MODEL_DIR}/m'}\n")
    assert config.model.model_path == "/tmp/models/m"
    config = load_config(text="model: {model_path: '${oc.env:RFT_SURELY_UNSET_VAR,/opt/m}'}\n")
    assert config.model.model_path == "/opt/m"
    err = _error("model: {model_path: '${oc.env:RFT_SURELY_UNSET_VAR}'}\n")
    assert err.problems[0].path == "model.model_path"
    assert "RFT_SURELY_UNSET_VAR" in str(err)


@pytest.fixture(autouse=True)
def _model_dir_env(monkeypatch):
    monkeypatch.setenv("RFT_TEST_MODEL_DIR", "/tmp/models")


def test_overrides_and_env_overrides_of_addresses_and_secrets():
    config = load_config(
        text="buffer: {batch_size: 2}\n",
        overrides=["buffer.batch_size=5", "synchronizer.sync_offset=1"],
        environ={"RFT_BUFFER_PORT": "50051", "RFT_AUTH_TOKEN": "tok", "RFT_REDIS_URL": "redis://h:1/0"},
    )
    assert config.buffer.batch_size == 5
    assert config.synchronizer.sync_offset == 1
    assert config.services.buffer.port == 50051
    assert config.services.auth_token == "tok"
    assert config.services.buffer.redis_url == "redis://h:1/0"


def test_stage_overrides_are_validated_with_their_path():
    err = _error("stages:\n  - stage_name: sft\n    algorithm: {algorithm_type: sftt}\n")
    assert str(err.problems[0]).startswith("stages[0].algorithm.algorithm_type: 'sftt' is not allowed")
    assert "did you mean `sft`?" in str(err.problems[0])


def test_config_is_frozen():
    config = load_config(text="")
    with pytest.raises(Exception, match="frozen"):
        config.buffer.batch_size = 3  # type: ignore[misc]


def test_yaml_syntax_error_and_missing_file(tmp_path):
    err = _error("buffer: [unclosed\n")
    assert "YAML syntax error" in str(err)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")


def test_a_duplicate_key_is_a_config_error_naming_it():
    err = _error("buffer:\n  batch_size: 2\nbuffer:\n  batch_size: 4\n")
    assert "duplicate key buffer" in str(err) and "line 3" in str(err)


def test_buffer_consumer_groups_are_declared_and_checked():
    assert load_config(text="").services.buffer.consumer_groups == ["default"]
    config = load_config(text="services: {buffer: {consumer_groups: [default, eval]}}\n")
    assert config.services.buffer.consumer_groups == ["default", "eval"]
    for bad, message in (
        ("[]", "at least 1 item"),
        ('[default, ""]', "consumer group name '' must be"),
        ("[a, b, a]", "consumer group names repeat: a"),
        ("[" + ", ".join(f"g{i}" for i in range(17)) + "]", "at most 16 items"),
    ):
        err = _error(f"services: {{buffer: {{consumer_groups: {bad}}}}}\n")
        assert str(err.problems[0]).startswith("services.buffer.consumer_groups:"), err
        assert message in str(err), err


def test_a_misspelt_sample_strategy_gets_a_suggestion():
    err = _error("algorithm:\n  sample_strategy: staleness_contrl\n")
    assert "did you mean `staleness_control`?" in str(err)
