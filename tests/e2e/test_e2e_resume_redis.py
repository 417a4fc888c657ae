"""The multi-process stack on a real `redis-server` (`services.buffer.store: redis`), stopped with
SIGINT halfway and started again: the first `rft run` stops every process and exits 130, the second
continues from the checkpoint (trainer step, explorer position, experiences still in Redis) and
finishes with exactly `total_steps` trained steps."""

from __future__ import annotations

import json
import signal

import pytest
import redis

from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.rft_run import (
    SUMMARY_KEYS,
    assert_no_orphans,
    jsonl,
    poll_until,
    run_rft,
    start_rft,
    tiny_model,
    write_config,
)

pytestmark = pytest.mark.slow

TOTAL = 16


@pytest.fixture
def redis_url():
    require_redis_server()
    with RedisServer.start() as server:
        yield server.url


def test_sigint_halfway_then_resume_on_redis(tmp_path, redis_url):
    tree = {
        "project": "e2e",
        "name": "resume",
        "mode": "both",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "kl_loss_fn": "none",
                      "optimizer": {"lr": 1e-3}},
        "model": {"model_path": str(tiny_model()), "max_prompt_tokens": 8, "max_response_tokens": 4},
        "buffer": {"batch_size": 4, "total_epochs": 100, "total_steps": TOTAL, "explorer_input": {"taskset": {
            "path": "examples/data/arithmetic.jsonl", "default_workflow_type": "arithmetic",
            "format": {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer"}}}},
        "explorer": {"eval_on_startup": False},
        "synchronizer": {"sync_method": "memory", "sync_interval": 1, "sync_offset": 0},
        "trainer": {"save_interval": 1, "max_checkpoints_to_keep": 2},
        "monitor": {"monitor_type": "none"},
        "services": {"buffer": {"store": "redis", "redis_url": redis_url}},
    }  # fmt: skip
    config = write_config(tmp_path / "run.yaml", tree)
    job = tmp_path / "ckpt" / "e2e" / "resume"
    trainer_metrics = job / "metrics" / "trainer.jsonl"

    log = tmp_path / "first.log"
    first = start_rft(config, log=log)
    try:
        poll_until(lambda: len(jsonl(trainer_metrics)) >= TOTAL // 2 or first.poll() is not None,
                   240, "the trainer to reach half way")  # fmt: skip
        assert first.poll() is None, log.read_text()[-3000:]
        first.send_signal(signal.SIGINT)
        code = first.wait(150)
    finally:
        if first.poll() is None:
            first.kill()
    out = log.read_text()
    assert code == 130, out[-3000:]
    assert_no_orphans(out)
    stopped = json.loads((job / "summary.json").read_text())
    assert stopped["status"] == "interrupted"
    assert TOTAL // 2 <= stopped["steps"] < TOTAL
    assert redis.Redis.from_url(redis_url).keys("rft*"), "the buffer kept nothing in Redis"

    second = run_rft(config, timeout_s=200)
    out2 = second.stdout + second.stderr
    assert second.returncode == 0, out2[-4000:]
    assert_no_orphans(out2)
    summary = json.loads((job / "summary.json").read_text())
    assert all(summary.get(k) is not None for k in SUMMARY_KEYS), summary
    assert summary["status"] == "finished"
    assert summary["steps"] == TOTAL
    assert (job / "latest_checkpointed_iteration.txt").read_text().strip() == str(TOTAL)
    steps = [r["step"] for r in jsonl(trainer_metrics)]
    resumed_from = stopped["steps"]
    # the second run picked up after the saved step instead of starting over
    assert steps[:resumed_from] == list(range(1, resumed_from + 1))
    assert steps[-(TOTAL - resumed_from) :] == list(range(resumed_from + 1, TOTAL + 1))
    assert "resumed" in (job / "log" / "explorer.log").read_text()
