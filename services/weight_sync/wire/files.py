"""The `checkpoint` method: versioned safetensors state dicts under a run folder, published atomically.

Layout of `CheckpointStore(root)` (the synchronizer's choice, e.g. `<job_dir>/weight_sync/`):
```
root/state_dict_v00000012.safetensors   one file per version (tied weights stored once, codec.py)
root/state_dict_v00000012.from_v00000011.delta   with `delta`: the change from the version before
root/latest_state_dict_iteration.txt    the published version number, written LAST
```
Each file is the codec's safetensors payload (`codec.encode_state_dict_buffer`: the same header for
every version of one model). Publishing is crash-safe: the file is written to a temporary name in the
same folder, fsynced and renamed into place (`stage`), then the marker is replaced the same way
(`publish`). A crash at any point leaves the previously published version readable; a staged but unpublished file is never
read through `latest`. After publishing, versions beyond the newest `keep` are pruned (the published
one is never removed). Reading uses safetensors only - nothing is unpickled.

Deltas (`save(..., delta=True)`, `synchronizer.delta_sync`). Before publishing a version the store
also writes, next to it, the delta from the published version before it (`delta.make_delta`: XOR of
the words as byte planes, zstd, a crc32 per tensor), when that is smaller than `max_ratio` of the file. An explorer that holds the previous version's payload reads the delta
instead of the file (`read_payload`): N explorers read N deltas from the shared folder, not N files. The
full file is always written, for late joiners and any reader without the base.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import safetensors
import torch

from services.weight_sync.errors import CheckpointNotFoundError
from services.weight_sync.wire.codec import CodecError, encode_state_dict_buffer, restore_aliases
from services.weight_sync.wire.delta import DeltaMismatchError, apply_delta, make_delta

MARKER = "latest_state_dict_iteration.txt"
_FILE_RE = re.compile(r"^state_dict_v(\d+)\.safetensors$")
_DELTA_RE = re.compile(r"^state_dict_v(\d+)\.from_v(\d+)\.delta$")


def delta_path(path: str | os.PathLike[str], base_version: int) -> Path:
    """Where the delta from `base_version` to the version whose file is `path` lies (beside it)."""
    p = Path(path)
    return p.with_name(f"{p.name.removesuffix('.safetensors')}.from_v{base_version:08d}.delta")


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
        self.delta_bytes = 0  # the last `save(delta=True)`'s delta file (0: none written)

    def path_of(self, version: int) -> Path:
        return self.root / f"state_dict_v{version:08d}.safetensors"

    def stage(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> Path:
        """Write the file of `version` atomically without publishing it; returns its path."""
        return self._write(version, encode_state_dict_buffer(state_dict))

    def _write(self, version: int, payload: bytes | bytearray) -> Path:
        """The codec's safetensors payload as the file of `version`, written atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_of(version)
        _atomic_write(path, lambda tmp: Path(tmp).write_bytes(payload))
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

    def save(
        self,
        version: int,
        state_dict: Mapping[str, torch.Tensor],
        *,
        delta: bool = False,
        max_ratio: float = 0.9,
    ) -> Path:
        """`stage` + `publish`; with `delta`, the delta from the published version (when it is under
        `max_ratio` of the file) is written beside the file before publishing."""
        payload = encode_state_dict_buffer(state_dict)
        path = self._write(version, payload)
        self.delta_bytes = self._write_delta(version, payload, max_ratio) if delta else 0
        self.publish(version)
        return path

    def _write_delta(self, version: int, payload: bytes | bytearray, max_ratio: float) -> int:
        """Write the delta from the published version to `payload`; its size, 0 when none is written."""
        base = self.latest_version()
        if base is None or base >= version or not self.path_of(base).is_file():
            return 0
        d = make_delta(self.path_of(base).read_bytes(), payload, base, version)
        if d is None or len(d) >= max_ratio * len(payload):
            return 0
        _atomic_write(delta_path(self.path_of(version), base), lambda tmp: Path(tmp).write_bytes(d))
        return len(d)

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
        kept = set(versions) - set(doomed)
        for p in self.root.iterdir() if doomed else ():
            m = _DELTA_RE.match(p.name)
            if m and int(m.group(1)) not in kept:
                p.unlink(missing_ok=True)
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


def read_payload(
    path: str | os.PathLike[str], held: tuple[int, bytes | bytearray] | None = None
) -> tuple[bytearray, int, bool]:
    """The payload (file bytes) of the version whose file is `path`: from the delta beside it when
    `held` = (its base version, that version's payload) and one is there (checked tensor by tensor),
    else the file. Returns (payload, bytes read, whether they were a delta)."""
    if held is not None:
        try:
            d = delta_path(path, held[0]).read_bytes()
            return apply_delta(held[1], d, base_version=held[0]), len(d), True
        except (OSError, DeltaMismatchError, CodecError):
            pass  # none from that version, unreadable, or not from this base: the file
    if not Path(path).is_file():
        raise CheckpointNotFoundError(f"state dict file {path} not found")
    payload = bytearray(Path(path).read_bytes())
    return payload, len(payload), False
