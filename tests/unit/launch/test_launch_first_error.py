"""The first exception of a service's log (launcher/processes.py `first_error`), from logs
written the way services write them: structlog JSON lines (`log.exception`, `log.error(error=...)`)
and uncaught Python tracebacks, chained ones included; only the output of the latest start counts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from launcher.processes import first_error

ROOT = Path(__file__).resolve().parents[3]

CHAINED = textwrap.dedent("""
    import importlib
    print("starting", flush=True)
    try:
        importlib.import_module("first_error_no_such_module")
    except ImportError as exc:
        raise ImportError("cannot import module 'first_error_no_such_module' of plug-in 'x:Y'") from exc
""")  # fmt: skip


def _python(code: str, log) -> int:
    with log.open("ab") as fh:
        return subprocess.run([sys.executable, "-c", code], stdout=fh, stderr=subprocess.STDOUT).returncode


def test_an_uncaught_chained_traceback_gives_its_last_exception(tmp_path):
    log = tmp_path / "svc.log"
    assert _python(CHAINED, log) == 1
    text = log.read_text()
    assert "The above exception was the direct cause" in text  # a chained traceback indeed
    assert (
        first_error(log) == "ImportError: cannot import module 'first_error_no_such_module' of plug-in 'x:Y'"
    )


STRUCTLOG = textwrap.dedent("""
    import sys
    from services.common.log import configure_logging

    log = configure_logging("explorer", run="r", fmt="json", stream=sys.stdout)
    log.warning("workflow failed", error="ValueError: a retried task")  # a warning is not it
    if sys.argv[1] == "exception":
        try:
            raise KeyError("unknown workflow 'arithmetik'")
        except KeyError:
            log.exception("explorer failed", error="KeyError: unknown workflow")
    log.error("cannot listen", error="PortInUseError: port 5 on 127.0.0.1 is in use")
""")  # fmt: skip


def test_a_structlog_exception_line_and_an_error_field(tmp_path):
    log = tmp_path / "svc.log"
    with log.open("w") as fh:
        subprocess.run([sys.executable, "-c", STRUCTLOG, "exception"], stdout=fh, check=True, cwd=ROOT)
    assert first_error(log) == "KeyError: \"unknown workflow 'arithmetik'\""
    with log.open("w") as fh:
        subprocess.run([sys.executable, "-c", STRUCTLOG, "error"], stdout=fh, check=True, cwd=ROOT)
    assert first_error(log) == "PortInUseError: port 5 on 127.0.0.1 is in use"


def test_only_the_output_after_the_offset_counts_and_none_without_an_exception(tmp_path):
    log = tmp_path / "svc.log"
    _python("raise SystemError('the first start failed')", log)
    offset = log.stat().st_size
    _python("print('serving'); raise ZeroDivisionError('the second start failed')", log)
    assert first_error(log) == "SystemError: the first start failed"
    assert first_error(log, offset) == "ZeroDivisionError: the second start failed"
    _python("print('a clean exit')", log)
    assert first_error(log, log.stat().st_size) is None
    assert first_error(tmp_path / "missing.log") is None
