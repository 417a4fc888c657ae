"""The checkpoint method: atomic publish, crash safety, pruning, and safetensors-only loading."""

from __future__ import annotations

import pytest
import torch

from services.weight_sync import CheckpointNotFoundError, CheckpointStore, read_state_dict
from services.weight_sync.wire.files import MARKER


def _sd(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(20, 8, generator=g)
    return {"embed": emb, "head": emb, "w": torch.randn(8, 8, generator=g).to(torch.bfloat16)}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_save_and_load_latest_and_given_version(tmp_path):
    store = CheckpointStore(tmp_path / "sync", keep=3)
    assert store.latest_version() is None
    with pytest.raises(CheckpointNotFoundError, match="no published"):
        store.load()
    store.save(1, _sd(1))
    path = store.save(2, _sd(2))
    version, sd = store.load()
    assert version == 2 and _equal(sd, _sd(2)) and sd["head"] is sd["embed"]
    assert _equal(store.load(1)[1], _sd(1))
    assert _equal(read_state_dict(path), _sd(2))
    assert path.read_bytes()[8:9] == b"{"  # a safetensors JSON header, not a pickle
    with pytest.raises(CheckpointNotFoundError, match="version 9"):
        store.load(9)


def test_crash_before_the_marker_leaves_the_previous_version_readable(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    store.save(1, _sd(1))
    store.stage(2, _sd(2))  # the writer dies here, before publish()
    (tmp_path / ".state_dict_v00000003.safetensors.x.tmp").write_bytes(b"half a file")  # died mid-write
    reader = CheckpointStore(tmp_path, keep=2)
    version, sd = reader.load()
    assert version == 1 and _equal(sd, _sd(1))
    assert reader.versions() == [1, 2]  # the temp file is not a version
    reader.publish(2)
    assert reader.load()[0] == 2 and (tmp_path / MARKER).read_text().strip() == "2"
    assert not list(tmp_path.glob(f".{MARKER}*"))


def test_old_versions_are_pruned_but_never_the_published_one(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for v in range(1, 6):
        store.save(v, _sd(v))
    assert store.versions() == [4, 5]
    store.stage(6, _sd(6))
    store.stage(7, _sd(7))
    assert store.prune() == [4]  # 5 is published, so it stays though older than 6 and 7
    assert store.versions() == [5, 6, 7] and store.load()[0] == 5
    with pytest.raises(CheckpointNotFoundError):
        store.publish(4)
    with pytest.raises(ValueError):
        CheckpointStore(tmp_path, keep=0)
