"""A small real disk for full-disk faults: a tmpfs mounted on a folder (root only), filled with a ballast
file until writes fail with ENOSPC, and freed again.

    with SmallDisk.mount(tmp_path / "disk", "64m") as disk:   # None when no tmpfs can be mounted
        disk.fill()     # the next write of anything on it fails (ENOSPC)
        disk.free()     # the space is back
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


@dataclass
class SmallDisk:
    path: Path
    why_not: ClassVar[str] = ""  # why the last mount failed

    @classmethod
    @contextlib.contextmanager
    def mount(cls, path: Path, size: str = "64m") -> Iterator[SmallDisk | None]:
        """The mounted disk, or None (the reason in `SmallDisk.why_not`) when mounting fails."""
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            cls.why_not = done.stderr.strip() or f"mount exited with {done.returncode}"
            yield None
            return
        try:
            yield cls(path)
        finally:
            subprocess.run(["umount", "-l", str(path)], check=False)

    @property
    def ballast(self) -> Path:
        return self.path / "ballast"

    def fill(self) -> None:
        """Write the ballast until the disk is full (whatever writes beside it gets ENOSPC from then on)."""
        with self.ballast.open("ab", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * (1 << 20))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
            with contextlib.suppress(OSError):  # the last partial megabyte, byte pages at a time
                while True:
                    fh.write(b"\0" * 4096)

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)
