"""A TCP proxy between two real processes that can cut, half-cut or delay the link, for partition tests.

    with NetProxy.start("127.0.0.1", upstream_port) as proxy:   # clients dial proxy.port
        proxy.cut()          # both directions: bytes are held back, new connections hang (a partition,
                             # not a reset: nothing tells either side the link is gone)
        proxy.cut("up")      # one way: client -> server bytes are held, replies to what got through flow
        proxy.delay(2.0)     # every chunk waits 2 s in each direction
        proxy.heal()         # back to a plain pipe; held connections resume where they stopped
        proxy.drop_replies() # the next reply's first bytes close the connection instead (the server
                             # answered, the client never hears it: a lost response)

It runs its own asyncio loop in a thread; modes apply to live connections as well as new ones. A cut holds
the bytes of the cut direction(s) and delivers them on heal, as TCP's retransmissions do across a partition
that heals in time (TCP never drops bytes from the middle of a stream); a new connection made during any
cut hangs until heal, since its handshake cannot cross.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

UP, DOWN = "up", "down"  # client -> server, server -> client


@dataclass
class _Mode:
    held: frozenset[str] = frozenset()  # directions whose bytes wait for heal
    delay_s: float = 0.0


class NetProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.mode = _Mode()
        self.connections = 0
        self.dropped = 0  # replies dropped so far
        self._drop = 0
        self._changed: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="netproxy", daemon=True)

    @classmethod
    @contextlib.contextmanager
    def start(cls, upstream_host: str, upstream_port: int) -> Iterator[NetProxy]:
        proxy = cls(upstream_host, upstream_port)
        proxy._thread.start()
        asyncio.run_coroutine_threadsafe(proxy._listen(), proxy._loop).result(10)
        try:
            yield proxy
        finally:
            proxy.close()

    # ---- control (from any thread) ------------------------------------------------------------
    def cut(self, direction: str = "both") -> None:
        if direction == "both":
            self._set(_Mode(held=frozenset({UP, DOWN})))
        else:
            assert direction in (UP, DOWN), direction
            self._set(_Mode(held=frozenset({direction})))

    def delay(self, seconds: float) -> None:
        self._set(_Mode(delay_s=seconds))

    def drop_replies(self, count: int = 1) -> None:
        async def arm() -> None:
            self._drop += count

        asyncio.run_coroutine_threadsafe(arm(), self._loop).result(10)  # armed before this returns

    def heal(self) -> None:
        self._set(_Mode())

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _set(self, mode: _Mode) -> None:
        def apply() -> None:
            self.mode = mode
            assert self._changed is not None
            self._changed.set()
            self._changed = asyncio.Event()

        self._loop.call_soon_threadsafe(apply)

    # ---- the pipe (on the proxy's loop) -------------------------------------------------------
    async def _listen(self) -> None:
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _wait_until(self, ok) -> None:
        while not ok():
            assert self._changed is not None
            await self._changed.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await self._wait_until(lambda: not self.mode.held)  # a partition: the connection goes nowhere
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, up_writer, UP), self._pipe(up_reader, writer, DOWN), return_exceptions=True
        )

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, direction: str) -> None:
        try:
            while chunk := await src.read(65536):
                await self._wait_until(lambda: direction not in self.mode.held)
                if direction == DOWN and self._drop:  # a lost reply: the client's connection just ends
                    self._drop -= 1
                    self.dropped += 1
                    return
                if self.mode.delay_s:
                    await asyncio.sleep(self.mode.delay_s)  # ok-sleep: the injected link delay
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()
