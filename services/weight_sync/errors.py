"""Exceptions of the weight-sync layer, shared by every method so callers catch one family.

`WeightSyncError` is the base: a transfer failed and the weights on the receiving side must be
treated as not updated. `GroupBrokenError` means a broadcast group lost a member, timed out or was
aborted; the group is unusable and the synchronizer rebuilds it with a new generation.
`StaleGenerationError` means a member tried to join a group instance other than the one it was told
about. `MissingChunkError` and `CheckpointNotFoundError` belong to the memory and checkpoint methods;
`DeltaMismatchError` to the memory method's delta pulls (`delta.py`: the receiver then pulls in full).
"""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """A weight transfer failed; the receiver's weights are not the new version."""


class GroupBrokenError(WeightSyncError):
    """A broadcast group failed (peer died, timeout, abort); rebuild it with a new generation."""


class StaleGenerationError(WeightSyncError):
    """The member's generation does not match the group it reached."""


class MissingChunkError(WeightSyncError):
    """A memory-method chunk stream is incomplete, out of order or inconsistent."""


class DeltaMismatchError(WeightSyncError):
    """A weight delta is malformed or does not apply to the base the receiver holds."""


class CheckpointNotFoundError(WeightSyncError, FileNotFoundError):
    """No published state dict (or not the requested version) under the run folder."""
