"""Start a real `redis-server` for tests and benchmarks: a free loopback port, a temporary directory,
no persistence by default (`--save '' --appendonly no`) or AOF when a test needs to restart Redis,
optional password, and a clean stop (SIGTERM, then SIGKILL after a deadline).

    with RedisServer.start() as server:
        url = server.url

`require_redis_server()` skips the calling test with a loud reason when the binary is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REDIS_BINARY = os.environ.get("RFT_REDIS_SERVER", "redis-server")


def find_redis_server() -> str | None:
    return shutil.which(REDIS_BINARY) or (REDIS_BINARY if os.path.isfile(REDIS_BINARY) else None)


def require_redis_server() -> str:
    """The redis-server path, or skip the test saying loudly why (CI installs it, so CI never skips)."""
    path = find_redis_server()
    if path is None:
        import pytest

        pytest.skip(
            f"!!! redis-server binary {REDIS_BINARY!r} not found on PATH: Redis store tests SKIPPED. "
            "Install it (apt-get install redis-server) or set RFT_REDIS_SERVER."
        )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    """A running redis-server process on 127.0.0.1:`port` with its data in `directory`."""

    port: int
    directory: Path
    password: str | None = None
    appendonly: bool = False
    binary: str = "redis-server"
    appendfsync: str = "always"  # "everysec" as the compose stack runs it
    process: subprocess.Popen | None = None
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        *,
        appendonly: bool = False,
        password: str | None = None,
        binary: str | None = None,
        timeout_s: float = 10.0,
    ) -> RedisServer:
        binary = binary or find_redis_server()
        if binary is None:
            raise FileNotFoundError(f"redis-server binary {REDIS_BINARY!r} not found")
        tmp = tempfile.TemporaryDirectory(prefix="rft-redis-")
        server = cls(
            port=free_port(),
            directory=Path(tmp.name),
            password=password,
            appendonly=appendonly,
            binary=binary,
            _tmp=tmp,
        )
        server.launch(timeout_s)
        return server

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def launch(self, timeout_s: float = 10.0) -> None:
        """(Re)start the process on the same port and directory (with AOF, data comes back)."""
        args = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self._answers_ping():
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"redis-server did not answer on port {self.port} in {timeout_s}s")
            time.sleep(0.02)  # ok-sleep: polling with a deadline

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                if self.password:
                    sock.sendall(f"AUTH {self.password}\r\n".encode())
                    sock.recv(64)
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (Redis shuts down cleanly, writing the AOF), SIGKILL if it does not exit in time."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
