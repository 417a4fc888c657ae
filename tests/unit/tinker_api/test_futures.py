"""The Tinker server's futures: a sampling client's completion log read with a cursor (what
`retrieve_futures` answers), results dropped once retrieved, and queued work cancelled."""

from __future__ import annotations

import threading

import pytest

from tinker_api.futures import Futures, UnknownFuture


def test_completions_cursor_retrieved_and_cancel() -> None:
    futures = Futures()
    gate = threading.Event()
    try:
        blocker = futures.submit(lambda: gate.wait(30), group="a")  # holds the one worker
        queued = futures.submit(lambda: 1, group="a")
        other = futures.submit(lambda: 2, group="b")
        assert futures.completions("a", 0, 0.0, []) == ([], 0)  # nothing ended yet; no wait
        assert futures.cancel(queued)  # not started: dropped
        assert futures.wait(queued, 0).cancelled()
        done, cursor = futures.completions("a", 0, 5.0, [])
        assert (done, cursor) == ([{"state": "failed", "request_id": queued}], 1)
        gate.set()
        done, cursor = futures.completions("a", cursor, 5.0, [])  # the cancelled one is trimmed
        assert (done, cursor) == ([{"state": "finished", "request_id": blocker}], 2)
        assert not futures.cancel(blocker)  # already ended
        bad = futures.submit(lambda: 1 / 0, group="a")
        done, cursor = futures.completions("a", cursor, 5.0, [blocker])
        assert (done, cursor) == ([{"state": "failed", "request_id": bad}], 3)
        with pytest.raises(UnknownFuture):  # reported retrieved: its result is gone
            futures.wait(blocker, 0)
        assert futures.wait(other, 5).result() == 2  # another group's work is its own
        assert futures.completions("b", 0, 0.0, [])[0] == [{"state": "finished", "request_id": other}]
    finally:
        gate.set()
        futures.shutdown()
