"""structlog set-up: JSON lines for services, readable output on a console, with service/run/step fields.

Logging never raises into the code that logs: on a full disk (or another I/O error of the log file) a
line is dropped, and the next line that gets through is preceded by one saying how many were lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from typing import Any, TextIO

import structlog


class LossyStream:
    """A log stream whose failed writes (OSError: ENOSPC, EIO, ...) drop the line instead of raising."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.dropped = 0
        self.why = ""

    def write(self, text: str) -> int:
        try:
            if self.dropped:
                notice = {
                    "event": "log lines lost",
                    "lines": self.dropped,
                    "error": self.why,
                    "level": "warning",
                }
                self.stream.write(json.dumps(notice) + "\n")
                self.dropped = 0
            self.stream.write(text)
        except OSError as exc:
            self.dropped += text.count("\n")  # print() writes a line, then its newline
            self.why = f"{type(exc).__name__}: {exc}"
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):  # what the stream buffered is written by a later flush
            self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def configure_logging(
    service: str,
    *,
    run: str | None = None,
    level: str = "INFO",
    fmt: str = "auto",
    stream: TextIO | None = None,
) -> structlog.stdlib.BoundLogger:
    """Configure structlog (and stdlib logging through it) once per process and return a bound logger.

    `fmt`: `json` (one object per line), `console` (readable), or `auto` (console on a TTY, else JSON).
    Bind the current step with `structlog.contextvars.bind_contextvars(step=n)`.
    """
    out: Any = stream or sys.stderr
    if not isinstance(out, LossyStream):
        out = LossyStream(out)
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    level_no = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=level_no, stream=out, format="%(levelname)s %(name)s: %(message)s", force=True)
    structlog.contextvars.clear_contextvars()
    fields = {"service": service}
    if run:
        fields["run"] = run
    structlog.contextvars.bind_contextvars(**fields)
    return structlog.get_logger(service)


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
