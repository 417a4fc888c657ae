"""Checkpoint TTLs: a save's `ttl_seconds` or `set_checkpoint_ttl` gives a checkpoint an expiry time.

The time (Unix seconds) is kept in an `expires_at` file in the checkpoint's folder, so it holds
across server restarts. An expired checkpoint is removed the next time it is listed or loaded; it
then reads as any deleted one ("no checkpoint at ..."). A TTL of None removes the expiry.
"""

from __future__ import annotations

import time
from pathlib import Path

MIN_TTL_S = 3600  # Tinker's range: an hour to ten years
MAX_TTL_S = 10 * 365 * 24 * 3600
FILE = "expires_at"


class TtlError(ValueError):
    """A TTL outside Tinker's range."""


def check_ttl(ttl_seconds: int | None) -> None:
    if ttl_seconds is not None and not MIN_TTL_S <= int(ttl_seconds) <= MAX_TTL_S:
        raise TtlError(
            f"ttl_seconds {ttl_seconds}: between {MIN_TTL_S} (an hour) and {MAX_TTL_S} (ten years)"
        )


def set_ttl(folder: Path, ttl_seconds: int | None) -> None:
    check_ttl(ttl_seconds)
    if ttl_seconds is None:
        (folder / FILE).unlink(missing_ok=True)
    else:
        (folder / FILE).write_text(str(time.time() + int(ttl_seconds)))


def expires_at(folder: Path) -> float | None:
    f = folder / FILE
    return float(f.read_text()) if f.is_file() else None


def expired(folder: Path) -> bool:
    at = expires_at(folder)
    return at is not None and at <= time.time()
