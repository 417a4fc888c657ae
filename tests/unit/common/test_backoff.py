"""Backoff: each wait doubles the delay up to its ceiling, the blocking wait as the async one; `cap` bounds a sleep."""

from __future__ import annotations

import asyncio

from services.common.backoff import Backoff


def test_blocking_and_async_waits_double_up_to_the_ceiling_and_reset():
    blocking, awaited = Backoff(first=0.01, most=0.03), Backoff(first=0.01, most=0.03)
    for want in (0.02, 0.03, 0.03):
        blocking.wait_blocking(cap=0)  # cap 0: no sleep at all, the delay still moves on
        asyncio.run(awaited.wait(cap=0))
        assert blocking.delay == awaited.delay == want
    blocking.reset()
    assert blocking.delay == 0.01
