"""`rft run` prints the warnings of keys that have no effect here before anything starts, and its path
checks are those of `rft config check`."""

from __future__ import annotations

from launcher import EXIT_CONFIG, EXIT_FAILED, run


def test_run_prints_config_warnings_at_start_then_refuses_a_missing_model(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "mode: train\nmodel: {model_path: no_such_model}\n"
        "explorer: {concurrent_mode: multi-threading}\n"
        "trainer: {trainer_config: {critic: {model: {fsdp_config: {param_offload: true}}}}}\n"
    )
    monkeypatch.chdir(tmp_path)
    assert run(cfg) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "rft run: warning: explorer.concurrent_mode: 'multi-threading' has no effect here" in err
    assert "rft run: warning: trainer.trainer_config.critic.model.fsdp_config.param_offload" in err
    assert "model.model_path 'no_such_model' (relative to the current directory" in err


def test_run_refuses_a_refused_key_as_a_config_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mode: train\nalgorithm: {optimizer: {clip_grad: 0.3}}\n")
    assert run(cfg, ["stages.0.x=1"]) == EXIT_CONFIG  # a bad --set: exit 2, no traceback
    assert run(cfg) == EXIT_CONFIG
    assert "algorithm.optimizer.clip_grad: 0.3 is not supported" in capsys.readouterr().err
