"""A launched service dies with `rft run`: the child asks the kernel for SIGTERM when its launcher
dies (PR_SET_PDEATHSIG, set in the child before it execs the service, same pid), so a SIGKILLed
`rft run` leaves no orphan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.rft_run import alive, poll_until

ROOT = Path(__file__).resolve().parents[3]

LAUNCHER = """
import sys
from pathlib import Path
from launcher.processes import ServiceProcess
p = ServiceProcess(name="svc", argv=[sys.executable, "-c", "import signal; signal.pause()"],
                   log_file=Path(sys.argv[1]))
p.start()
print(p.pid, flush=True)
sys.stdin.read()  # until the test kills this launcher
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_a_child_dies_with_its_sigkilled_launcher(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}"}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path / "svc.log")], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        child = int(launcher.stdout.readline())
        poll_until(lambda: "signal.pause()" in Path(f"/proc/{child}/cmdline").read_text(), 10,
                   "the child to exec the service")  # fmt: skip
        assert Path(f"/proc/{child}/stat").read_text().split()[3] == str(launcher.pid)  # same pid, our child
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        poll_until(lambda: not alive(child), 10, "the child to die with its launcher")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait(10)


RANK_IN_ITS_OWN_SESSION = """
import os, signal, subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
os.kill(rank.pid, signal.SIGSTOP)  # as torchrun's rank 1 in the wedge test: stopped, in its own session
open(sys.argv[1], "w").write(str(rank.pid))
signal.pause()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="descendants are read from /proc")
def test_kill_also_ends_a_stopped_grandchild_in_a_session_of_its_own(tmp_path):
    """What `rft run` does to a hung trainer: torchrun's ranks run in sessions of their own, out of the
    process group's SIGKILL, and a stopped rank would never notice its group gone."""
    from launcher.processes import ServiceProcess

    pid_file = tmp_path / "rank.pid"
    p = ServiceProcess(name="trainer", argv=[sys.executable, "-c", RANK_IN_ITS_OWN_SESSION, str(pid_file)],
                       log_file=tmp_path / "trainer.log")  # fmt: skip
    p.start(ROOT)
    rank = 0
    try:
        rank = int(poll_until(lambda: pid_file.is_file() and pid_file.read_text(), 30, "the rank's pid"))
        assert Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        p.kill()
        assert p.wait(10) is not None
        poll_until(lambda: not alive(rank), 10, "the stopped rank to be gone")
    finally:
        p.kill()
        if rank and alive(rank):  # a failed run leaves no stopped process behind
            os.kill(rank, signal.SIGKILL)
