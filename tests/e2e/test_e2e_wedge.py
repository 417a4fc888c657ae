"""A wedge inside a full run: the real explorer's generate call blocks on a real lock held by a stopped
helper process. A Redis-store `rft run` with the hf engine's fault hook on (services/explorer/engines/
fault_hook.py: the first generate batch at model version `WEDGE_AT` takes an `flock` on a file) while a
helper process holds that lock and is SIGSTOPped. The explorer's event loop keeps answering, but its
"generate call" unit does not move past `services.progress_timeout` (short here): `rft run` logs the
stuck thread's stack (in the hook's `flock`), kills the explorer and starts another (which the hook
leaves alone), the run completes at `total_steps` with the helper still stopped, and the audit finds
nothing lost and nothing trained twice."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from launcher.audit import audit_job
from services.explorer.engines.fault_hook import AT_ENV, LOCK_ENV
from tests.support.chaos import log_tails, write_chaos_config
from tests.support.redis_server import RedisServer, require_redis_server
from tests.support.rft_run import assert_no_orphans, poll_until, start_rft

pytestmark = pytest.mark.slow

TOTAL, WEDGE_AT, PROGRESS_S = 4, 2, 5
HOLD = "import fcntl, signal, sys; fh = open(sys.argv[1], 'a'); fcntl.flock(fh, fcntl.LOCK_EX); print('held', flush=True); signal.pause()"  # noqa: E501


@pytest.fixture
def redis_url():
    require_redis_server()
    with RedisServer.start(appendonly=True) as server:
        yield server.url


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _seen(log: Path, pattern: str, proc: subprocess.Popen[bytes]) -> tuple[re.Match[str] | None, float]:
    """(the match of `pattern` in the run's output, or None once `rft run` ended; when it was seen)."""
    found = poll_until(
        lambda: re.search(pattern, log.read_text(errors="replace")) or proc.poll() is not None, 120, pattern
    )
    return (found if isinstance(found, re.Match) else None), time.time()


@pytest.mark.timeout(400)
def test_a_generate_call_wedged_in_a_full_run_is_found_replaced_and_the_audit_is_clean(
    tmp_path, redis_url, monkeypatch
):
    config, job = write_chaos_config(
        tmp_path, redis_url, total_steps=TOTAL, save_interval=2, prefix=f"wedge-{uuid.uuid4().hex[:6]}"
    )
    tree = yaml.safe_load(config.read_text())
    tree["services"]["progress_timeout"] = PROGRESS_S
    config.write_text(yaml.safe_dump(tree, sort_keys=False))
    lock, log = tmp_path / "wedge.lock", tmp_path / "rft.log"
    helper = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    proc: subprocess.Popen[bytes] | None = None
    try:
        assert helper.stdout is not None and helper.stdout.readline() == "held\n"
        os.kill(helper.pid, signal.SIGSTOP)  # it holds the lock, stopped, until the test ends
        monkeypatch.setenv(LOCK_ENV, str(lock))
        monkeypatch.setenv(AT_ENV, str(WEDGE_AT))
        t0 = time.monotonic()
        proc = start_rft(config, log=log)
        hung, found_at = _seen(log, r"explorer hung: its event loop answers but its work does not move: "
                                    r"generate call has not moved for (\d+) s \(limit (\d+) s\); killed and "
                                    r"restarted \(1/\d+\)", proc)  # fmt: skip
        assert hung, log_tails(log, job)
        back, back_at = _seen(log, r"explorer ready at \S+ after restart \(1/\d+\)", proc)
        assert back, log_tails(log, job)
        assert _state(helper.pid) == "T"  # the lock was never given back: the explorer was replaced
        code = proc.wait(max(1.0, 300 - (time.monotonic() - t0)))
        wall_s = time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper.pid, signal.SIGCONT)
        helper.kill()
        helper.wait(10)
        if proc is not None and proc.poll() is None:
            proc.kill()
    out = log.read_text(errors="replace")
    assert code == 0, log_tails(log, job)
    assert_no_orphans(out)
    pid, wedged_at = (lock.parent / f"{lock.name}.wedged").read_text().split()
    stack = out[out.index("explorer stuck thread's stack") : hung.start()]
    assert "fault_hook.py" in stack and "fcntl.flock" in stack and "_run" in stack, stack
    still, limit = int(hung.group(1)), int(hung.group(2))
    # asked every 5 s (the default liveness_timeout's probe interval): found within the limit and one probe
    assert limit >= PROGRESS_S and limit <= still < limit + 10, hung.group(0)
    assert out.count("hung:") == 1, out[-5000:]  # only the explorer, once: its replacement is not wedged
    audit = audit_job(job)
    assert audit.steps == TOTAL and audit.trained_once == TOTAL * 16, audit
    assert (audit.trained_twice, audit.lost, audit.unknown) == (0, 0, 0), audit
    assert audit.produced == audit.trained_once + audit.remaining, audit
    found_s, back_s = found_at - float(wedged_at), back_at - float(wedged_at)
    print(f"wedge (explorer pid {pid}) found in {found_s:.1f} s (limit {limit} s), replaced in {back_s:.1f} s; "
          f"wall {wall_s:.0f} s; audit {audit.as_dict()}")  # fmt: skip
