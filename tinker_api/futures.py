"""Real futures: a request is queued and answered at once with its id; its result comes later.

One worker thread runs the queued work in order (a model is never trained and sampled at once;
forward_backward, optim_step and saves of one client apply in the order they were sent).
`retrieve_future` waits up to `wait_s` for a result and otherwise answers `try_again`, as Tinker's
long poll does. Results are kept `keep_s` after they finish; an unknown or expired id is an error.

Work submitted with a `group` (a sampling client: its session id and clone id) also lands, when it
ends, in that group's completion log, which `retrieve_futures` reads with a cursor: one long poll
per sampling client instead of one per request. Results the client reports retrieved are dropped;
`cancel` drops queued work that has not started.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


class UnknownFuture(KeyError):
    """No future by that id: never created, or expired."""


@dataclass
class _Log:
    """One group's completions, oldest first: (cursor, request_id, "finished" or "failed")."""

    cursor: int = 0
    events: list[tuple[int, str, str]] = field(default_factory=list)


class Futures:
    def __init__(self, keep_s: float = 600.0) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-work")
        self._futures: dict[str, tuple[Future[Any], float]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # notified when a grouped future ends
        self._logs: dict[Hashable, _Log] = {}
        self.keep_s = keep_s

    def submit(self, fn: Callable[[], Any], group: Hashable | None = None) -> str:
        request_id = f"req-{next(self._ids)}"
        future = self._pool.submit(fn)
        with self._lock:
            self._futures[request_id] = (future, time.monotonic())
            self._expire()
        if group is not None:  # runs at once if the work has already ended
            future.add_done_callback(lambda f: self._log(group, request_id, f))
        return request_id

    def _expire(self) -> None:
        now = time.monotonic()
        for rid, (fut, t0) in list(self._futures.items()):
            if fut.done() and now - t0 > self.keep_s:
                del self._futures[rid]
        for log in self._logs.values():  # a completion whose result is gone is no longer news
            log.events = [e for e in log.events if e[1] in self._futures]

    def _log(self, group: Hashable, request_id: str, future: Future[Any]) -> None:
        state = "failed" if future.cancelled() or future.exception() is not None else "finished"
        with self._ended:
            log = self._logs.setdefault(group, _Log())
            log.cursor += 1
            log.events.append((log.cursor, request_id, state))
            self._ended.notify_all()

    def wait(self, request_id: str, wait_s: float) -> Future[Any] | None:
        """The finished future, or None while it is still running after `wait_s`."""
        with self._lock:
            entry = self._futures.get(request_id)
        if entry is None:
            raise UnknownFuture(request_id)
        future = entry[0]
        try:
            future.exception(timeout=wait_s)
        except TimeoutError:
            return None
        except CancelledError:  # dropped by `cancel`: ended too
            pass
        return future

    def completions(
        self, group: Hashable, prev_cursor: int, wait_s: float, retrieved: list[str]
    ) -> tuple[list[dict[str, str]], int]:
        """The group's completions after `prev_cursor` (those at or before it are trimmed), waiting up
        to `wait_s` for one, and the cursor to send next; the `retrieved` results are dropped."""
        deadline = time.monotonic() + wait_s
        with self._ended:
            for rid in retrieved:
                self._futures.pop(rid, None)
            log = self._logs.setdefault(group, _Log())
            log.events = [e for e in log.events if e[0] > prev_cursor]
            while not log.events and (left := deadline - time.monotonic()) > 0:
                self._ended.wait(left)
            events = list(log.events)
        cursor = events[-1][0] if events else max(prev_cursor, 0)
        return [{"state": state, "request_id": rid} for _, rid, state in events], cursor

    def cancel(self, request_id: str) -> bool:
        """Drop queued work that has not started (True); work already running finishes."""
        with self._lock:
            entry = self._futures.get(request_id)
        if entry is None:
            raise UnknownFuture(request_id)
        return entry[0].cancel()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
