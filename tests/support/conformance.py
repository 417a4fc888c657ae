"""What the conformance suites' tests share: a service started as a process on a free port from a config
text (`service_process`), `rft conformance SERVICE ADDRESS ARGS` run as a user runs it (`conformance`),
and the suite's lines read back as {check: PASS|FAIL|SKIP} (`statuses`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'protos'}")


@contextmanager
def service_process(name: str, config_text: str, workdir: Path, start_s: float = 90) -> Iterator[str]:
    """`python -m services.NAME --config` (the config written to `workdir`) on a free port; its address."""
    config, port_file, log = workdir / f"{name}.yaml", workdir / f"{name}.port", workdir / f"{name}.log"
    config.write_text(config_text)
    command = [
        sys.executable,
        "-m",
        f"services.{name}",
        "--config",
        str(config),
        "--port-file",
        str(port_file),
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.02)  # ok-sleep: polling with a deadline for the port file
        yield f"127.0.0.1:{port_file.read_text().strip()}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def conformance(service: str, address: str, *args: str, timeout_s: float = 240) -> tuple[int, str]:
    """Run `rft conformance SERVICE ADDRESS ARGS` as a process; (exit code, stdout + stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "launcher.cli", "conformance", service, address, *args,
        cwd=ROOT, env=ENV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    return proc.returncode or 0, out.decode()


def statuses(output: str) -> dict[str, str]:
    """{check name: PASS|FAIL|SKIP} from the suite's lines."""
    found = {}
    for line in output.splitlines():
        status, _, rest = line.partition(" ")
        if status in ("PASS", "FAIL", "SKIP") and ":" in rest:
            found[rest.split(":", 1)[0]] = status
    return found
