"""Logging never raises into the code that logs: a log stream that fails like a full disk (ENOSPC on
every write and flush) drops lines, and the first line written once space returns says how many were
lost."""

from __future__ import annotations

import errno
import io
import json

from services.common.log import LossyStream, configure_logging


class _Disk(io.StringIO):
    """A text stream that fails like a full disk while `full`."""

    full = False

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)

    def flush(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_drops_log_lines_and_says_so_once_space_returns():
    disk = _Disk()
    log = configure_logging("trainer", fmt="json", stream=disk)
    log.info("before")
    disk.full = True
    log.error("during", step=3)  # would raise OSError into the caller without the lossy stream
    log.info("during again")
    disk.full = False
    log.info("after")
    lines = [json.loads(line) for line in disk.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["before", "log lines lost", "after"]
    assert lines[1]["lines"] == 2 and "No space left on device" in lines[1]["error"]


def test_the_lossy_stream_passes_everything_through_when_writes_succeed():
    out = io.StringIO()
    stream = LossyStream(out)
    assert stream.write("a\n") == 2
    stream.flush()
    assert out.getvalue() == "a\n" and stream.dropped == 0 and not stream.isatty()
