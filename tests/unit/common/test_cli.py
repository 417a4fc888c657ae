"""The `rft` command: config check/show exit codes and messages, serve of a missing service."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def test_config_check_ok():
    # a config for a GPU machine: its model and data are not here, so the path checks are skipped
    example = str(ROOT / "examples/verl_mapping/grpo_example.yaml")
    result = runner.invoke(app, ["config", "check", example, "--skip-paths"])
    assert result.exit_code == 0, result.output
    assert "train_batch_size=2048" in result.output
    # veRL keys this trainer does not read load with a warning naming their full path
    assert "warning: trainer.trainer_config.actor_rollout_ref.model.use_remove_padding" in result.output
    result = runner.invoke(app, ["config", "check", example])
    assert result.exit_code == 2
    assert (
        "model.model_path 'deepseek-ai/deepseek-llm-7b-chat' (relative to the current directory"
        in result.output
    )


def test_config_check_resolves_relative_paths_as_rft_run_does(tmp_path, monkeypatch):
    from launcher.preflight import PreflightError, preflight
    from launcher.stages import run_stages
    from services.common.config import load_config

    (tmp_path / "tasks.jsonl").write_text("{}\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model: {model_path: models/m, max_response_tokens: 4}\n"
        "buffer: {explorer_input: {taskset: {path: tasks.jsonl}}}\n"
    )
    monkeypatch.chdir(tmp_path)  # the folder `rft run` and `rft config check` are started from
    result = runner.invoke(app, ["config", "check", "c.yaml"])
    assert result.exit_code == 2 and "model.model_path 'models/m'" in result.output
    with pytest.raises(PreflightError, match="model.model_path 'models/m'"):
        preflight([s.config for s in run_stages(load_config(cfg))])
    (tmp_path / "models" / "m").mkdir(parents=True)
    result = runner.invoke(app, ["config", "check", "c.yaml"])
    assert result.exit_code == 0, result.output
    preflight([s.config for s in run_stages(load_config(cfg))])
    monkeypatch.chdir(ROOT)  # from another folder both refuse the same relative path
    assert runner.invoke(app, ["config", "check", str(cfg)]).exit_code == 2


def test_config_check_set_of_a_stage_and_bad_set_exit_codes(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("stages: [{stage_name: a}]\n")
    ok = runner.invoke(app, ["config", "show", str(cfg), "--set", "stages.0.buffer.total_steps=12"])
    assert ok.exit_code == 0, ok.output
    assert "total_steps: 12" in ok.output
    bad = runner.invoke(app, ["config", "check", str(cfg), "--set", "stages.2.buffer.total_steps=12"])
    assert (
        bad.exit_code == 2
        and "--set stages.2.buffer.total_steps=12: stages is a list of 1 item(s)" in bad.output
    )


def test_config_check_bad_file_exits_2_with_path(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("buffer:\n  explorer_input:\n    tasksets:\n      - format: {prompt_kye: q}\n")
    result = runner.invoke(app, ["config", "check", str(bad)])
    assert result.exit_code == 2
    assert "buffer.explorer_input.tasksets[0].format.prompt_kye: unknown key" in result.output
    assert "did you mean `prompt_key`?" in result.output


def test_config_show_prints_defaults_and_resolved(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm: {algorithm_type: grpo, repeat_times: 4}\nbuffer: {batch_size: 2}\n")
    result = runner.invoke(app, ["config", "show", str(cfg), "--set", "buffer.batch_size=3"])
    assert result.exit_code == 0, result.output
    assert "train_batch_size: 12" in result.output
    assert "sync_method: nccl" in result.output
    assert "max_response_tokens: null" in result.output.split("resolved:")[1]  # nothing samples here
    derived = runner.invoke(app, ["config", "show", str(cfg), "--set", "model.max_model_len=64",
                                  "--set", "model.max_prompt_tokens=40", "--set", "explorer.rollout_model.use_v1=false"])  # fmt: skip
    resolved = derived.output.split("resolved:")[1]
    assert "max_response_tokens: 24" in resolved and "max_model_len: 64" in resolved
    assert "warning: explorer.rollout_model.use_v1: False has no effect here" in derived.output


def test_config_show_resolves_the_fully_async_staleness_bound(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("synchronizer: {sync_style: fully_async, sync_interval: 2}\n")
    result = runner.invoke(app, ["config", "show", str(cfg)])
    assert result.exit_code == 0, result.output
    assert "max_staleness: 8" in result.output.split("resolved:")[1]  # 4 publishes x sync_interval


def test_serve_unknown_service():
    result = runner.invoke(app, ["serve", "bufer", "--config", "run.yaml"])
    assert result.exit_code == 2
    assert "unknown service 'bufer'" in result.output
    wrong = runner.invoke(app, ["serve", "buffer", "--config", "run.yaml", "--shard", "0/2"])
    assert wrong.exit_code == 2 and "explorer only" in wrong.output
    bare = runner.invoke(app, ["serve", "buffer"])
    assert bare.exit_code == 2 and "needs --config" in bare.output
    # the service-backed Tinker mode takes both, refused before anything is served
    half = runner.invoke(app, ["serve", "tinker", "--synchronizer", "127.0.0.1:1"])
    assert half.exit_code != 0 and "--synchronizer and --explorer go together" in str(half.exception)


def test_serve_help_lists_every_option():
    text = runner.invoke(app, ["serve", "--help"], terminal_width=200).output
    for option in (
        "--config",
        "--set",
        "--port",
        "--port-file",
        "--plugin-dir",
        "--explorer-id",
        "--shard",
        "--host",
        "--api-key",
        "--synchronizer",
        "--explorer",
    ):
        assert option in text, option
