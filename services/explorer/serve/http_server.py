"""Runs the served endpoint inside the explorer's event loop.

`HttpServer` binds `explorer.serve.host:port` itself (port 0: a free port, known at once), runs
uvicorn on that socket, and writes the URL `http://host:port/v1` to `<job_dir>/run/serve.url`, which
`rft run` prints as `endpoint: ...`. uvicorn's own signal handling is off: the explorer's SIGTERM
handler stops the service, and `stop()` stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from services.common.config.explorer import SERVE_URL_FILE as URL_FILE


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the explorer's service loop owns SIGTERM/SIGINT
        yield


class HttpServer:
    def __init__(self, app: FastAPI, host: str, port: int):
        self.app, self.host = app, host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as exc:
            self.sock.close()
            raise OSError(
                f"explorer.serve: cannot bind {host}:{port} ({exc}); pick another port or 0"
            ) from exc
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self.server = _Uvicorn(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[self.sock]))

    def write_url(self, run_dir: Path) -> Path:
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / URL_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.url + "\n")
        tmp.replace(path)
        return path

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self.sock.close()
