"""`Backoff`: the one exponential wait between retries (a synchronizer that is away, a full buffer).

`wait()` sleeps the current delay and doubles it up to a ceiling (`wait_blocking()` the same in a
thread without an event loop); `reset()` after a call that succeeded. Every retry loop of the services uses it, so they space their calls the same way.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["Backoff"]


class Backoff:
    """Exponential waits between retries: `first` seconds, doubling up to `most`; `reset()` after a
    call that succeeded."""

    def __init__(self, first: float = 0.05, most: float = 1.0):
        self.first, self.most = first, most
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    async def wait(self, cap: float | None = None) -> None:
        """Sleep the current delay (at most `cap` seconds), then double it."""
        delay = self.delay if cap is None else min(self.delay, max(cap, 0.0))
        await asyncio.sleep(delay)  # ok-sleep: backing off between retries (no event to wait on)
        self.delay = min(self.delay * 2, self.most)

    def wait_blocking(self, cap: float | None = None) -> None:
        """`wait()` for a thread without an event loop: sleep the current delay (at most `cap`), double it."""
        delay = self.delay if cap is None else min(self.delay, max(cap, 0.0))
        time.sleep(delay)  # ok-sleep: backing off between polls (no event to wait on)
        self.delay = min(self.delay * 2, self.most)
