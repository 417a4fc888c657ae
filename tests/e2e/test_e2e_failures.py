"""`rft run` failing the right way: a bad config exits 2 naming the file and the key before anything
starts; a Redis store that does not answer exits 1 before anything starts; a service that dies exits 1
naming it with its last log lines, and the other services are stopped."""

from __future__ import annotations

import pytest

from tests.support.redis_server import free_port
from tests.support.rft_run import assert_no_orphans, run_rft, tiny_model, write_config

pytestmark = pytest.mark.slow


def _config(tmp_path, **extra):
    tree = {
        "project": "e2e",
        "name": "fail",
        "mode": "explore",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tiny_model()), "max_response_tokens": 4},
        "buffer": {"batch_size": 2, "total_steps": 2, "explorer_input": {"taskset": {
            "path": "examples/data/arithmetic.jsonl", "default_workflow_type": "arithmetic",
            "format": {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer"}}}},
        "monitor": {"monitor_type": "none"},
    }  # fmt: skip
    tree.update(extra)
    return write_config(tmp_path / "run.yaml", tree)


def test_bad_config_exits_2_naming_the_file_and_key(tmp_path):
    config = _config(tmp_path, synchronizer={"sync_style": "fixd"})
    proc = run_rft(config, timeout_s=60)
    assert proc.returncode == 2, proc.stderr
    assert str(config) in proc.stderr
    assert "synchronizer.sync_style" in proc.stderr and "fixed" in proc.stderr
    assert not (tmp_path / "ckpt").exists()  # nothing started


def test_bad_override_exits_2(tmp_path):
    proc = run_rft(_config(tmp_path), "buffer.batch_sise=3", timeout_s=60)
    assert proc.returncode == 2
    assert "batch_sise" in proc.stderr and "batch_size" in proc.stderr


def test_redis_that_does_not_answer_exits_1_before_anything_starts(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    config = _config(tmp_path, services={"buffer": {"store": "redis", "redis_url": url}})
    proc = run_rft(config, timeout_s=60)
    assert proc.returncode == 1, proc.stderr
    assert url in proc.stderr and "does not answer" in proc.stderr
    assert not (tmp_path / "ckpt").exists()


def test_a_failing_service_exits_1_naming_it_with_its_log(tmp_path):
    # the file exists (preflight passes) but a row lacks the prompt key and bad rows are errors:
    # only the explorer, reading the rows, finds out
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "1+2=", "answer": "3"}\n{"q": "2+2=", "answer": "4"}\n')
    config = _config(tmp_path)
    proc = run_rft(
        config,
        f"buffer.explorer_input.taskset.path={data}",
        "buffer.explorer_input.taskset.on_bad_row=error",
        timeout_s=200,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the explorer failed" in proc.stderr
    assert "last lines of the explorer log" in proc.stderr
    assert "its first error:" in proc.stderr and "question" in proc.stderr  # the service's own error
    assert_no_orphans(proc.stdout + proc.stderr)
    summary = (tmp_path / "ckpt" / "e2e" / "fail" / "summary.json").read_text()
    assert '"status": "failed"' in summary
