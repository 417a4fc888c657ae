"""Runs the served endpoint inside the explorer's event loop and keeps its policy current.

`HttpServer` binds `explorer.serve.host:port` itself (port 0: a free port, known at once), runs
uvicorn on that socket, and writes the URL `http://host:port/v1` to `<job_dir>/run/serve.url`, which
`rft run` prints as `endpoint: ...`. uvicorn's own signal handling is off: the explorer's SIGTERM
handler stops the service, and `stop()` stops the server.

`follow_weights` replaces the explore loop's sync gate in serve mode: there are no explore steps, so
it waits (`WaitForVersion` with `min_version` = held + 1) for any version newer than the one it holds,
fetches it with the run's `sync_method` (`SyncMethod.fetch`, the same fetch
as the explorer), loads it into the engines between generations and reports the load. It returns
when the run finished (the trainer reached its `total_steps`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import uvicorn
from fastapi import FastAPI
from rft.v1 import synchronizer_pb2

from services.common.config.explorer import SERVE_URL_FILE as URL_FILE
from services.common.log import get_logger
from services.weight_sync import GroupBrokenError, StaleGenerationError
from services.weight_sync.member.away import Backoff, is_away, synchronizer_away
from services.weight_sync.member.client import SyncClient
from services.weight_sync.method import SyncMethod

log = get_logger("explorer.serve")


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


async def follow_weights(
    client: SyncClient, fetch: Callable[[synchronizer_pb2.WaitForVersionResponse], Awaitable[int]],
    window_s: float, method: SyncMethod,
) -> None:  # fmt: skip
    """Load every newer published version until the run finishes (module docstring). `method`: the
    run's, typed once in its settings record (ExplorerSettings.sync_method)."""
    held, backoff = client.model_version, Backoff()
    while True:
        try:
            answer = await client.wait_for_version(min_version=held + 1, timeout_s=window_s)
        except grpc.aio.AioRpcError as exc:
            await synchronizer_away(exc, client.register)
            await backoff.wait()
            continue
        backoff.reset()
        if answer.finished:
            return
        if answer.timed_out:
            continue
        offered = int(answer.model_version.version)
        if not method.wants(answer, held):
            continue
        try:
            loaded = await fetch(answer)
        except (GroupBrokenError, StaleGenerationError) as exc:  # the next generation sends again
            await client.report_load(offered, False, answer.generation, f"{type(exc).__name__}: {exc}")
            continue
        except grpc.aio.AioRpcError as exc:  # the synchronizer went away or moved on mid-pull: ask again
            if not is_away(exc):
                raise
            await backoff.wait()
            continue
        held = max(held, loaded)
        await client.report_load(loaded, True, answer.generation)
        log.info("serving new weights", model_version=loaded)
