"""Start a real OpenEnv environment server for tests: `examples/openenv_server.py` (an environment
written with OpenEnv's own server kit) as a subprocess on a free loopback port.

    with OpenEnvServer.start() as server:
        url = server.url

The server binds port 0 itself and prints `port=<N>` first; the start then polls `/health` with a
deadline until it answers, and the stop is SIGTERM, then SIGKILL after a deadline.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "examples" / "openenv_server.py"


@dataclass
class OpenEnvServer:
    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, script: Path = SERVER, timeout_s: float = 60.0) -> OpenEnvServer:
        process = subprocess.Popen(
            [sys.executable, str(script), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None
        first = process.stdout.readline().strip()  # blocks until the socket is bound (or the process died)
        if not first.startswith("port="):
            rest = first + process.stdout.read() if process.wait(timeout_s) is not None else first
            raise RuntimeError(
                f"the OpenEnv server did not start (exit {process.returncode}): {rest[-2000:]}"
            )
        server = cls(process=process, port=int(first.removeprefix("port=")))
        deadline = time.monotonic() + timeout_s
        while not server.healthy():
            if process.poll() is not None:
                raise RuntimeError(
                    f"the OpenEnv server exited with {process.returncode}: {process.stdout.read()}"
                )
            if time.monotonic() > deadline:
                server.stop()
                raise TimeoutError(f"the OpenEnv server did not answer /health in {timeout_s}s")
            time.sleep(0.02)  # ok-sleep: polling with a deadline
        return server

    def healthy(self) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
        try:
            with opener.open(f"{self.url}/health", timeout=1.0) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> OpenEnvServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
