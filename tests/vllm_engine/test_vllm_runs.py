"""Whole `rft run`s with `explorer.rollout_model.engine_type: vllm` (all four services as processes,
started from the vLLM environment, the Redis store, memory weight sync), one per sync style, each a
few GRPO steps on the tiny model and each audited: every experience the buffer accepted was trained
exactly once or is still in the buffer (none lost, none twice), with the versions its style promises:

- `fixed`, sync_offset 0: explore step s samples with the weights of trainer step s - 1, and trainer
  step s trains exactly explore step s's batch (strictly on-policy);
- `fixed`, sync_offset 1: explore step s samples with weights of step s - 2 or s - 1. In this run the
  explorer is SIGKILLed once it has finished step 1, while it samples the next step: its vLLM engine core and worker die with it (the
  launcher kills what is left of its process group), `rft run` restarts it and the run completes,
  exactly once, without the killed step's batch ever reaching the buffer;
- `fully_async` with in-flight weight updates: versions land while the explorer samples (responses
  of two versions), the explorer never waits for weights and every trained token is within the
  staleness bound.

Each run starts its own vLLM engine (a minute or more on two cores), so the three run at once:
`runs` starts them all, each test waits for its own.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from launcher.audit import redis_records
from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.rft_run import assert_no_orphans, jsonl, start_rft, write_config
from tests.vllm_engine.run_support import (
    Killed,
    ProcessTree,
    RunRecord,
    job_dir,
    kill_explorer_mid_step,
    read_run,
    vllm_run_tree,
    wait_gone,
)

RUN_TIMEOUT_S = 1500  # from the start of all three on a busy two-core machine; most of it is starting vLLM
RUNS: dict[str, dict[str, Any]] = {
    "fixed0": {"steps": 3, "sync_style": "fixed", "sync_offset": 0},
    # long answers (no EOS): the kill lands while step 2 samples
    "fixed1": {"steps": 4, "sync_style": "fixed", "sync_offset": 1, "response_tokens": 32, "ignore_eos": True},
    # long answers: each generation spans many decode steps, so publishes land inside them
    "async": {"steps": 4, "sync_style": "fully_async", "inflight": True, "response_tokens": 64,
              "ignore_eos": True},
}  # fmt: skip
KILL_AFTER_STEP = 1  # fixed1's explorer dies once it has finished explore step 1


@dataclass
class Launched:
    name: str
    steps: int
    config: Path
    job: Path
    proc: subprocess.Popen[bytes]
    log: Path
    tree: ProcessTree
    started: float = field(default_factory=time.monotonic)
    killed: Killed | None = None
    kill_error: BaseException | None = None
    killer: threading.Thread | None = None

    def finish(self) -> str:
        """Wait for `rft run` to end (then for every process it started); its output."""
        try:
            self.proc.wait(max(1.0, RUN_TIMEOUT_S - (time.monotonic() - self.started)))
        finally:
            self.tree.stop()
        return self.log.read_text(errors="replace")


def _kill(run: Launched) -> None:
    try:
        run.killed = kill_explorer_mid_step(run.config, run.job, KILL_AFTER_STEP, RUN_TIMEOUT_S)
    except BaseException as exc:  # reported by the test
        run.kill_error = exc


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    require_redis_server()
    with RedisServer.start() as server:
        yield server.url


@pytest.fixture(scope="module")
def runs(redis_url, tmp_path_factory) -> Iterator[dict[str, Launched]]:
    root = tmp_path_factory.mktemp("vllm_runs")
    launched: dict[str, Launched] = {}
    try:
        for name, options in RUNS.items():
            tree = vllm_run_tree(root, redis_url, name=name, **options)
            config = write_config(root / f"{name}.yaml", tree)
            log = root / f"{name}.log"
            proc = start_rft(config, log=log)
            launched[name] = Launched(name, options["steps"], config, job_dir(root, name), proc, log,
                                      ProcessTree(proc.pid))  # fmt: skip
        fixed1 = launched["fixed1"]
        fixed1.killer = threading.Thread(target=_kill, args=(fixed1,), daemon=True)
        fixed1.killer.start()
        yield launched
    finally:
        for run in launched.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(30)
            run.tree.stop()


def _finished(run: Launched) -> tuple[str, RunRecord]:
    """The run's output and record once it ended well: exit 0, nothing it started still running."""
    out = run.finish()
    assert run.proc.returncode == 0, out[-5000:]
    assert_no_orphans(out)
    leftovers = run.tree.leftovers()
    assert leftovers == [], f"still running after the run: {leftovers}"
    assert "EngineCore" in (run.job / "log" / "explorer.log").read_text(errors="replace")  # vLLM sampled
    record = read_run(run.job)
    assert record.audit.steps == run.steps, record.audit
    return out, record


def _clean(record: RunRecord, steps: int, per_step: int) -> None:
    """Every accepted experience trained exactly once or still in the buffer; nothing lost."""
    a = record.audit
    assert (a.trained_twice, a.lost, a.unknown) == (0, 0, 0), a
    assert a.trained_once == steps * per_step and a.produced == a.trained_once + a.remaining, a
    assert [r["step"] for r in record.train] == list(range(1, steps + 1))


PER_STEP = 2 * 4  # batch_size x repeat_times


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_fixed_offset_0_trains_each_explore_step_on_the_previous_weights(runs):
    run = runs["fixed0"]
    _, record = _finished(run)
    _clean(record, run.steps, PER_STEP)
    assert record.audit.remaining == 0  # it explored exactly what it trained
    for s in range(1, run.steps + 1):
        assert record.batches(s) == {str(s): PER_STEP}  # trainer step s trained explore step s
    for r in record.train:
        assert r["sample/staleness/max"] == 0.0 and r["sample/model_version/mean"] == r["step"] - 1
    assert [(r["step"], r["rollout/model_version"]) for r in record.explore] == [
        (s, float(s - 1)) for s in range(1, run.steps + 1)
    ]


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_fixed_offset_1_survives_its_explorer_killed_mid_step_exactly_once(runs, redis_url):
    run = runs["fixed1"]
    out, record = _finished(run)
    assert run.killer is not None
    run.killer.join(10)
    assert run.kill_error is None, run.kill_error
    killed = run.killed
    assert killed is not None
    names = " ".join(killed.children.values())
    assert "VLLM::EngineCore" in names and "VLLM::Worker" in names, killed.children
    # the engine core and its workers died with the explorer (the launcher killed its process group)
    wait_gone(killed.children, 30, "the killed explorer's children")
    assert "explorer exited with code -9 (killed by SIGKILL)" in out and "restarting (1/2)" in out, out[
        -3000:
    ]
    _clean(record, run.steps, PER_STEP)
    # the killed explorer put whole batches for steps 1..k (k >= the step it had finished when the kill
    # was sent; on a busy machine it may have finished one more), the step it was sampling never reached
    # the buffer, and the restarted explorer (incarnation 1) explored k+1 onwards, each batch whole
    accepted, _ = redis_records(redis_url, run.name)
    batches = Counter(uid.split("/")[2] for uid in accepted)
    first = sorted(int(b) for b in batches if "." not in b)
    k = len(first)
    assert first == list(range(1, k + 1)) and KILL_AFTER_STEP <= k < run.steps, sorted(batches)
    assert sorted(b for b in batches if "." in b) == [f"{s}.1" for s in range(k + 1, run.steps + 1)], batches
    assert set(batches.values()) == {PER_STEP}, batches
    # sync_offset 1: explore step s samples with the weights of step s - 2 or s - 1 (both explorers)
    for r in record.explore:
        s = r["step"]
        assert max(s - 2, 0) <= r["rollout/model_version"] <= s - 1, record.explore


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_fully_async_with_inflight_updates_mixes_versions_and_never_waits(runs):
    run = runs["async"]
    _, record = _finished(run)
    _clean(record, run.steps, PER_STEP)
    train, explore = record.train, record.explore
    # versions landed mid-generation: some responses hold tokens of two versions
    assert sum(r["rollout/inflight_updates"] for r in explore) >= 1, explore
    assert max(r["rollout/inflight_mixed_fraction"] for r in explore) > 0, explore
    assert max(r["rollout/model_version"] for r in explore) > 0
    # every trained token within the default bound (4 publishes); nothing dropped or masked as stale
    for r in train:
        assert 0 <= r["sample/staleness/mean"] <= r["sample/staleness/max"] <= 4, train
        assert 0 <= r["sample/token_staleness/mean"] <= r["sample/token_staleness/max"] <= 4, train
        assert r["sample/stale_tokens_masked"] == 0 and r["sample/dropped_stale"] == 0
    # the explorer never waited for weights (one WaitForVersion RPC per step); the trainer published every
    # step, and the explorer's in-flight follower loaded and reported each version
    assert max(r["time/wait_for_weights"] for r in explore) < 5.0, explore
    events = jsonl(run.job / "synchronizer" / "events.jsonl")
    assert [e["version"] for e in events if e["kind"] == "publish"] == list(range(1, run.steps + 1))
    assert {e["version"] for e in events if e["kind"] == "reported"} >= set(range(1, run.steps))
