"""A member that only does the store part of a weight-sync join (`group.rendezvous`), then dies.

It registers as its rank, tells the parent (`"registered"` on the pipe), and then either exits at
once (`exit_after=True`, no process group is ever built) or waits to be SIGKILLed; the tests use it
for "a receiver that joined the store and died before the communicator existed".
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from services.weight_sync.wire.group import GroupInfo


def _member(conn, info: GroupInfo, rank: int, exit_after: bool) -> None:
    from services.weight_sync.wire.group import rendezvous

    _store, _prefix = rendezvous(info, rank)
    conn.send("registered")
    if exit_after:
        os._exit(0)  # no close(): the store connection just drops, as in a crash
    conn.recv()  # wait for the parent's SIGKILL (or EOF when the parent goes)


class StoreMember:
    """A subprocess that joins `info`'s store as `rank` and then dies (see the module docstring)."""

    def __init__(self, info: GroupInfo, rank: int, exit_after: bool = False):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "services.weight_sync", __name__])
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_member, args=(child, info, rank, exit_after), daemon=True)
        self.proc.start()
        child.close()

    def registered(self, timeout: float = 30.0) -> None:
        if not self.conn.poll(timeout) or self.conn.recv() != "registered":
            raise TimeoutError(f"store member {self.proc.pid} did not register within {timeout}s")

    def kill(self) -> float:
        """SIGKILL the process (if still alive); returns the monotonic time of the kill."""
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        t = time.monotonic()
        self.proc.join(10)
        return t
