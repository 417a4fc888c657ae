"""Real futures: a request is queued and answered at once with its id; its result comes later.

One worker thread runs the queued work in order (a model is never trained and sampled at once;
forward_backward, optim_step and saves of one client apply in the order they were sent).
`retrieve_future` waits up to `wait_s` for a result and otherwise answers `try_again`, as Tinker's
long poll does. Results are kept `keep_s` after they finish; an unknown or expired id is an error.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class UnknownFuture(KeyError):
    """No future by that id: never created, or expired."""


class Futures:
    def __init__(self, keep_s: float = 600.0) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-work")
        self._futures: dict[str, tuple[Future[Any], float]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.keep_s = keep_s

    def submit(self, fn: Callable[[], Any]) -> str:
        request_id = f"req-{next(self._ids)}"
        future = self._pool.submit(fn)
        with self._lock:
            self._futures[request_id] = (future, time.monotonic())
            self._expire()
        return request_id

    def _expire(self) -> None:
        now = time.monotonic()
        for rid, (fut, t0) in list(self._futures.items()):
            if fut.done() and now - t0 > self.keep_s:
                del self._futures[rid]

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
        return future

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
