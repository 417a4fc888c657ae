"""structlog set-up: JSON lines for services, readable output on a console, with service/run/step fields."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog


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
    out = stream or sys.stderr
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
