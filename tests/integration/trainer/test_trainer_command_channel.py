"""The trainer's command channel between two real gloo ranks (CPU), each a spawned process.

Commands travel over the channel's own gloo group, so a worker rank idle in `worker_loop` for longer
than the default group's timeout still runs rank 0's next command; and a worker whose rank 0 is
SIGKILLed leaves `worker_loop` with gloo's error at once instead of waiting for any timeout.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time
from typing import Any

import pytest

from services.trainer.distributed import free_port
from tests.support.trainer_process_group_ranks import WORKER_FAILED, channel_rank

pytestmark = pytest.mark.slow

DEFAULT_TIMEOUT_S = 2.0  # the default group's; rank 0 idles twice as long between two commands
START_DEADLINE_S = 120.0  # spawning two ranks imports torch twice


def _start(scenario: str, default_timeout_s: float) -> tuple[list[Any], Any, Any]:
    """The two ranks, their message queue and their start barrier (kept alive while they run)."""
    ctx = mp.get_context("spawn")
    messages, start = ctx.Queue(), ctx.Barrier(2)
    port = free_port()
    procs = [
        ctx.Process(
            target=channel_rank,
            args=(rank, 2, port, scenario, default_timeout_s, messages, start),
            name=f"channel-rank{rank}",
            daemon=True,
        )
        for rank in range(2)
    ]
    for p in procs:
        p.start()
    return procs, messages, start


def _wait_for(messages: Any, wanted: set[tuple[str, int]], deadline: float) -> list[tuple]:
    """Messages read until every `(what, rank)` in `wanted` arrived (fails at `deadline`)."""
    got: list[tuple] = []
    while not wanted <= {m[:2] for m in got}:
        left = deadline - time.monotonic()
        assert left > 0, f"still waiting for {wanted - {m[:2] for m in got}}; got {got}"
        try:
            got.append(messages.get(timeout=left))
        except queue_mod.Empty:
            continue
        assert got[-1][0] != "raised" or got[-1][:2] in wanted, f"a worker failed: {got}"
    return got


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=10)


def test_idle_workers_outlast_the_default_groups_timeout_and_run_the_next_command():
    procs, messages, _start_barrier = _start("idle", DEFAULT_TIMEOUT_S)
    try:
        got = _wait_for(messages, {("stopped", 1), ("group", 0)}, time.monotonic() + START_DEADLINE_S)
        for p in procs:
            p.join(timeout=30)
        assert [p.exitcode for p in procs] == [0, 0], got
    finally:
        _stop(procs)
    by_kind = {m[:2]: m[2:] for m in got}
    assert by_kind[("stopped", 1)] == ([1, 2],)  # both commands ran on the worker, the second after the idle
    assert by_kind[("group", 0)] == ("gloo", True)  # the channel's own group, gloo


def test_worker_leaves_worker_loop_with_an_error_when_rank0_is_killed():
    procs, messages, _start_barrier = _start(
        "die", 1800.0
    )  # the default timeout: no timeout ends the worker's wait
    try:
        got = _wait_for(messages, {("ran", 1), ("ready", 0)}, time.monotonic() + START_DEADLINE_S)
        assert ("ran", 1, 1) in got
        killed_at = time.monotonic()
        procs[0].kill()
        procs[1].join(timeout=60)
        elapsed = time.monotonic() - killed_at
        assert procs[1].exitcode == WORKER_FAILED, procs[1].exitcode
        raised = _wait_for(messages, {("raised", 1)}, time.monotonic() + 10)
    finally:
        _stop(procs)
    assert elapsed < 30, elapsed  # promptly: far below any group timeout (default 1800 s, channel days)
    (error,) = [m for m in raised if m[0] == "raised"]
    assert error[2] in {"RuntimeError", "DistBackendError", "DistNetworkError", "DistError"}, error
    assert "peer" in error[3], error  # gloo saw rank 0's connection close ("closed/reset by peer")
