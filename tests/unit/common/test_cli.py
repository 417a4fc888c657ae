"""The `rft` command: config check/show exit codes and messages, serve of a missing service."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from services.cli import app

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()


def test_config_check_ok():
    result = runner.invoke(app, ["config", "check", str(ROOT / "examples/verl_mapping/grpo_example.yaml")])
    assert result.exit_code == 0, result.output
    assert "train_batch_size=2048" in result.output


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


def test_serve_unknown_service():
    result = runner.invoke(app, ["serve", "bufer"])
    assert result.exit_code == 2
    assert "unknown service 'bufer'" in result.output
