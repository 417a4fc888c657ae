"""Every registry name and `module:object` plug-in of a config resolves before anything starts
(launcher/names.py): one problem per bad name with its path, the known names and the closest
one; plug-ins whose module or attribute is missing; stages; plug-in folders that register names;
`rft config check` and `rft run` exit 2 listing them all."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from launcher import run
from launcher.cli import app
from launcher.names import check_config, check_names
from services.common.config import ConfigError, load_config

runner = CliRunner()
TASKSET = "buffer.explorer_input.taskset"


def _config(tree: dict | None = None, **sets: str):
    tree = tree or {"mode": "explore", "buffer": {"explorer_input": {"taskset": {"path": "t.jsonl"}}}}
    tree.setdefault("model", {"max_response_tokens": 4})
    overrides = [f"{k.replace('__', '.')}={v}" for k, v in sets.items()]
    return load_config(text=yaml.safe_dump(tree), overrides=overrides)


def _by_path(problems) -> dict[str, str]:
    return {p.path: p.message for p in problems}


@pytest.mark.parametrize(
    ("key", "bad", "close"),
    [
        ("advantage_fn", "grpoo", "grpo"),
        ("policy_loss_fn", "vanila", "vanilla"),
        ("kl_penalty_fn", "k33", "k3"),
        ("kl_loss_fn", "low_var_k", "low_var_kl"),
        ("entropy_loss_fn", "defualt", "default"),
        ("reward_manager", "naiv", "naive"),
    ],
)
def test_each_algorithm_name_is_checked_with_known_names_and_a_suggestion(key, bad, close):
    problems = _by_path(check_names(_config(**{f"algorithm__{key}": bad})))
    message = problems[f"algorithm.{key}"]
    assert f"{bad!r}" in message and f"did you mean `{close}`?" in message
    assert "known: " in message and close in message.split("known: ")[1]
    assert set(problems) == {f"algorithm.{key}"}  # nothing else, and no preset check in explore mode


def test_sync_method_is_checked_against_the_method_registry():
    problems = _by_path(check_names(_config(synchronizer__sync_method="memmory")))
    message = problems["synchronizer.sync_method"]
    assert "unknown weight sync method 'memmory'" in message and "did you mean `memory`?" in message
    assert "memory_bf16" in message.split("known: ")[1]
    for name in ("nccl", "online", "memory", "memory_bf16", "checkpoint"):
        assert check_names(_config(synchronizer__sync_method=name)) == [], name
    plugin = "services.weight_sync.methods.bf16:Bf16WireMethod"
    assert check_names(_config(synchronizer__sync_method=plugin)) == []
    # an adapter-only method needs a LoRA policy
    problems = _by_path(check_names(_config(synchronizer__sync_method="lora_adapter")))
    assert "model.lora_configs is empty" in problems["synchronizer.sync_method"]
    lora = _config(synchronizer__sync_method="lora_adapter", model__lora_configs=[{"lora_rank": 4}])
    assert check_names(lora) == []


def test_workflow_reward_and_environment_names_of_every_taskset_and_default():
    tree = {
        "mode": "explore",
        "buffer": {"explorer_input": {
            "tasksets": [
                {"path": "a.jsonl", "default_workflow_type": "math"},
                {"path": "b.jsonl", "default_workflow_type": "arithmetik", "default_reward_fn_type": "gsm8kk"},
                {"path": "c.jsonl", "default_workflow_type": "multi_turn", "workflow_args": {"env": "guess_numbr"}},
            ],
            "eval_tasksets": [{"path": "e.jsonl", "default_workflow_type": "simpel"}],
            "default_workflow_type": "mat",
            "default_eval_workflow_type": "math_boxd",
            "default_reward_fn_type": "countdwn",
        }},
    }  # fmt: skip
    problems = _by_path(check_names(_config(tree)))
    ei = "buffer.explorer_input"
    expected = {
        f"{ei}.tasksets[1].default_workflow_type": "arithmetic",
        f"{ei}.tasksets[1].default_reward_fn_type": "gsm8k",
        f"{ei}.tasksets[2].workflow_args.env": "guess_number",
        f"{ei}.eval_tasksets[0].default_workflow_type": "simple",
        f"{ei}.default_workflow_type": "math",
        f"{ei}.default_eval_workflow_type": "math_boxed",
        f"{ei}.default_reward_fn_type": "countdown",
    }
    assert set(problems) == set(expected)
    for path, close in expected.items():
        assert f"did you mean `{close}`?" in problems[path], (path, problems[path])
    assert "unknown workflow 'arithmetik'" in problems[f"{ei}.tasksets[1].default_workflow_type"]
    assert "unknown environment 'guess_numbr'" in problems[f"{ei}.tasksets[2].workflow_args.env"]


def test_plugin_whose_module_is_missing(tmp_path):
    problems = _by_path(
        check_names(_config(**{f"{TASKSET}__default_workflow_type": "no_such_module_x:Flow"}))
    )
    message = problems[f"{TASKSET}.default_workflow_type"]
    assert "cannot import module 'no_such_module_x'" in message and "No module named" in message


def test_plugin_whose_attribute_is_missing_or_of_the_wrong_kind(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    (tmp_path / "names_attr_plugin.py").write_text(
        "def score(s, gt, extra_info=None):\n    return 1.0\n\nLIMIT = 3\n"
    )
    config = _config(
        **{
            f"{TASKSET}__default_workflow_type": "names_attr_plugin:Flow",
            f"{TASKSET}__default_reward_fn_type": "names_attr_plugin:LIMIT",
            "algorithm__policy_loss_fn": "names_attr_plugin:score.missing",
        }
    )
    problems = _by_path(check_names(config))
    assert "'names_attr_plugin' has no attribute 'Flow'" in problems[f"{TASKSET}.default_workflow_type"]
    assert "not callable" in problems[f"{TASKSET}.default_reward_fn_type"]
    assert "has no attribute 'score.missing'" in problems["algorithm.policy_loss_fn"]
    # a plug-in that is what its kind needs resolves
    good = _config(**{f"{TASKSET}__default_reward_fn_type": "names_attr_plugin:score"})
    assert check_names(good) == []
    wrong_kind = _config(**{f"{TASKSET}__default_workflow_type": "names_attr_plugin:score"})
    assert "not a class" in _by_path(check_names(wrong_kind))[f"{TASKSET}.default_workflow_type"]


def test_stages_are_checked_as_the_configs_they_run_with():
    tree = {
        "mode": "both",
        "algorithm": {"kl_loss_fn": "k33"},
        "buffer": {"explorer_input": {"taskset": {"path": "t.jsonl"}}},
        "stages": [
            {"stage_name": "warmup", "mode": "train", "algorithm": {"algorithm_type": "sft"}},
            {"stage_name": "rl", "algorithm": {"policy_loss_fn": "vanila"}},
        ],
    }
    problems = check_names(_config(tree))
    paths = [p.path for p in problems]
    # the base's bad name is reported once, not again for each stage that inherits it
    assert paths == ["algorithm.kl_loss_fn", "stages[1].algorithm.policy_loss_fn"]
    assert "did you mean `vanilla`?" in problems[1].message


def test_the_trainer_preset_is_resolved_where_a_trainer_runs():
    bad_args = {"algorithm__policy_loss_fn_args": "{clip_ratio_lo: 0.2}"}
    problems = _by_path(check_names(_config(mode="both", **bad_args)))
    assert "clip_ratio_lo" in problems["algorithm"] and "clip_ratio_low" in problems["algorithm"]
    assert check_names(_config(mode="explore", **bad_args)) == []  # no trainer runs


def test_plugin_folders_register_names_and_resolve_relative_to_the_config(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    folder = tmp_path / "conf" / "my_plugins"
    folder.mkdir(parents=True)
    (folder / "names_registering_plugin.py").write_text(textwrap.dedent("""
        from services.explorer.workflows import WORKFLOWS, WorkflowBase

        @WORKFLOWS.register("names_test_flow")
        class Flow(WorkflowBase):
            pass
    """))  # fmt: skip
    cfg = tmp_path / "conf" / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "mode": "explore", "plugin_dirs": ["my_plugins"], "model": {"max_response_tokens": 4},
        "buffer": {"explorer_input": {"taskset": {"path": "t.jsonl", "default_workflow_type": "names_test_flow"}}},
    }))  # fmt: skip
    monkeypatch.chdir(tmp_path)  # relative plugin_dirs follow the config file, not the working folder
    config, problems = check_config(load_config(cfg), cfg)
    assert problems == []
    assert config.plugin_dirs == [str(folder.resolve())]
    # a folder that is not there is a problem of its own, and the names it would register stay unknown
    config, problems = check_config(load_config(cfg), cfg, ["nowhere"])
    assert _by_path(problems)["plugin_dirs"].startswith(
        f"plug-in folder {str(tmp_path / 'nowhere')!r} does not exist"
    )


def test_config_check_and_run_exit_2_listing_every_problem_before_anything_starts(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "mode": "both", "checkpoint_root_dir": str(tmp_path / "ckpt"), "model": {"max_response_tokens": 4},
        "algorithm": {"policy_loss_fn": "vanila", "kl_loss_fn": "k33"},
        "buffer": {"explorer_input": {"taskset": {
            "path": "t.jsonl", "default_workflow_type": "arithmetik", "default_reward_fn_type": "missing_mod_y:fn"}}},
    }))  # fmt: skip
    result = runner.invoke(app, ["config", "check", str(cfg)])
    assert result.exit_code == 2
    for text in ("algorithm.policy_loss_fn", "`vanilla`", "algorithm.kl_loss_fn", "`k3`",
                 f"{TASKSET}.default_workflow_type", "`arithmetic`", "missing_mod_y"):  # fmt: skip
        assert text in result.output, (text, result.output)
    assert run(cfg) == 2
    assert not (tmp_path / "ckpt").exists()  # nothing started


def test_config_check_and_show_take_plugin_dirs(tmp_path):
    folder = tmp_path / "plugs"
    folder.mkdir()
    (folder / "names_cli_plugin.py").write_text("def score(s, gt, extra_info=None):\n    return 0.0\n")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"mode": "explore", "model": {"max_response_tokens": 4}, "buffer": {"explorer_input": {"taskset": {
        "path": "t.jsonl", "default_reward_fn_type": "names_cli_plugin:score"}}}}))  # fmt: skip
    result = runner.invoke(app, ["config", "check", str(cfg), "--skip-paths"])
    assert result.exit_code == 2 and "cannot import module 'names_cli_plugin'" in result.output
    result = runner.invoke(app, ["config", "check", str(cfg), "--skip-paths", "--plugin-dir", str(folder)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["config", "show", str(cfg), "--plugin-dir", str(folder)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output.split("resolved:")[0])["plugin_dirs"] == [str(folder.resolve())]


def test_fixed_choices_are_refused_at_load_with_a_suggestion():
    # selectors, replay priority functions, engines, monitors and stores are literals
    bad = {
        f"{TASKSET}__data_selector__selector_type": ("shufle", "shuffle"),
        "buffer__trainer_input__experience_buffer__replay_buffer__priority_fn": (
            "linear_decy",
            "linear_decay",
        ),
        "explorer__rollout_model__engine_type": ("vlm", "vllm"),
        "monitor__monitor_type": ("tensorbord", "tensorboard"),
        "services__buffer__store": ("rediss", "redis"),
    }
    with pytest.raises(ConfigError) as err:
        _config(**{key: value for key, (value, _) in bad.items()})
    paths = {p.path: p.message for p in err.value.problems}
    for key, (_, close) in bad.items():
        assert f"did you mean `{close}`?" in paths[key.replace("__", ".")], paths


def test_names_of_the_shipped_examples_resolve():
    root = Path(__file__).resolve().parents[3]
    for name in ("quickstart.yaml", "ppo.yaml", "plugins/plugin.yaml"):
        path = root / "examples" / name
        config, problems = check_config(load_config(path), path)
        assert problems == [], (name, problems)
