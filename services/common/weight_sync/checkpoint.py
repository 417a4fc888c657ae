"""The `checkpoint` method: versioned safetensors state dicts under a run folder, published atomically.

Layout of `CheckpointStore(root)` (the synchronizer's choice, e.g. `<job_dir>/weight_sync/`):
```
root/state_dict_v00000012.safetensors   one file per version (tied weights stored once, codec.py)
root/latest_state_dict_iteration.txt    the published version number, written LAST
```
Publishing is crash-safe: the file is written to a temporary name in the same folder, fsynced and
renamed into place (`stage`), then the marker is replaced the same way (`publish`). A crash at any
point leaves the previously published version readable; a staged but unpublished file is never
read through `latest`. After publishing, versions beyond the newest `keep` are pruned (the published
one is never removed). Reading uses safetensors only - nothing is unpickled.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from services.common.weight_sync.codec import metadata_of, restore_aliases, split_aliases
from services.common.weight_sync.errors import CheckpointNotFoundError

MARKER = "latest_state_dict_iteration.txt"
_FILE_RE = re.compile(r"^state_dict_v(\d+)\.safetensors$")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening a directory
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


class CheckpointStore:
    """Versioned state dicts in one folder; `save` = `stage` + `publish` + prune."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def path_of(self, version: int) -> Path:
        return self.root / f"state_dict_v{version:08d}.safetensors"

    def stage(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> Path:
        """Write the file of `version` atomically without publishing it; returns its path."""
        self.root.mkdir(parents=True, exist_ok=True)
        unique, aliases = split_aliases(state_dict)
        meta = metadata_of(aliases, {"rft.version": str(version)})
        path = self.path_of(version)
        _atomic_write(path, lambda tmp: safetensors.torch.save_file(unique, tmp, metadata=meta))
        return path

    def publish(self, version: int) -> None:
        """Point the marker at a staged version, then prune old versions."""
        if not self.path_of(version).is_file():
            raise CheckpointNotFoundError(
                f"cannot publish version {version}: {self.path_of(version)} is missing"
            )
        marker = self.root / MARKER
        _atomic_write(marker, lambda tmp: Path(tmp).write_text(f"{version}\n"))
        self.prune()

    def save(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> Path:
        path = self.stage(version, state_dict)
        self.publish(version)
        return path

    def versions(self) -> list[int]:
        """Versions with a complete file on disk (published or not), ascending."""
        if not self.root.is_dir():
            return []
        found = (_FILE_RE.match(p.name) for p in self.root.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest_version(self) -> int | None:
        """The published version, or None when nothing was published yet."""
        try:
            text = (self.root / MARKER).read_text().strip()
        except FileNotFoundError:
            return None
        return int(text)

    def prune(self) -> list[int]:
        """Remove all but the newest `keep` versions (never the published one); returns the removed."""
        latest = self.latest_version()
        versions = self.versions()
        doomed = [v for v in versions[: max(0, len(versions) - self.keep)] if v != latest]
        for v in doomed:
            self.path_of(v).unlink(missing_ok=True)
        return doomed

    def load(
        self, version: int | None = None, device: str | torch.device = "cpu"
    ) -> tuple[int, dict[str, torch.Tensor]]:
        """`(version, state_dict)` of `version`, or of the published one when `version` is None."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise CheckpointNotFoundError(
                    f"no published state dict under {self.root} ({MARKER} is missing)"
                )
        path = self.path_of(version)
        if not path.is_file():
            raise CheckpointNotFoundError(f"state dict version {version} not found at {path}")
        return version, read_state_dict(path, device)


def read_state_dict(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Read one state-dict file written by `CheckpointStore` (or any safetensors file); no pickle."""
    if not Path(path).is_file():
        raise CheckpointNotFoundError(f"state dict file {path} not found")
    with safetensors.safe_open(str(path), framework="pt", device=str(torch.device(device))) as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open has no iter
    return restore_aliases(tensors, metadata)
