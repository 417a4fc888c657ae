"""`RunEnd`: an auto-started run always ends its process (failed unless the run said it succeeded), even
when something fails on the way out; a cancelled one (the service closing) leaves the stop to the closer."""

from __future__ import annotations

import asyncio

from services.common import app


async def test_a_run_end_stops_the_service_with_its_code_unless_cancelled():
    stop = app._STOP[0] = asyncio.Event()
    try:
        with app.RunEnd():  # an error on the way out: the process still ends, failed
            pass
        await asyncio.sleep(0)  # ok-sleep: one loop turn for the scheduled stop
        assert stop.is_set() and app._EXIT_CODE[0] == 1
        stop.clear()
        try:
            with app.RunEnd() as end:
                end.code = 0
                raise asyncio.CancelledError
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0)  # ok-sleep: one loop turn for a stop that must not come
        assert not stop.is_set()
    finally:
        app._STOP[0], app._EXIT_CODE[0] = None, 0
