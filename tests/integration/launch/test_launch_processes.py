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
