"""A fault-injection hook for tests, off by default: a generate call that wedges on a real lock.

With `RFT_FAULT_WEDGE_LOCK=PATH` in the explorer's environment, the `hf` engine's first generate batch
at model version `RFT_FAULT_WEDGE_AT` (default 1) or later takes an exclusive `flock` on PATH around
the batch. A test's helper process holds that lock and is SIGSTOPped, so the call blocks for good inside
its "generate call" progress unit while the event loop keeps answering: a real wedge of the real
explorer (tests/e2e/test_e2e_wedge.py). Once per run: the process that wedges first creates
`PATH.wedged` (its pid and the wall time it blocked at), and no later process (the explorer that
replaces it) takes the lock. Unset, the hook costs one environment lookup per batch.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

LOCK_ENV, AT_ENV = "RFT_FAULT_WEDGE_LOCK", "RFT_FAULT_WEDGE_AT"


def _claim(path: str) -> bool:
    """True for the one process of a run that wedges (the first to create `PATH.wedged`)."""
    try:
        fd = os.open(f"{path}.wedged", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{os.getpid()} {time.time():.3f}\n")
    return True


@contextlib.contextmanager
def wedge_hook(model_version: int) -> Iterator[None]:
    """Around one generate batch: hold PATH's lock when this is the batch to wedge (module docstring)."""
    path = os.environ.get(LOCK_ENV)
    if not path or model_version < int(os.environ.get(AT_ENV, "1")) or not _claim(path):
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # blocks while the stopped helper holds it
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
