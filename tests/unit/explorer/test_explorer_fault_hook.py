"""The hf engine's wedge hook (services/explorer/engines/fault_hook.py): off without its environment
variable, below its model version and after its one wedge; at its batch it holds a real `flock` on the
named file (another open of the file cannot take it) and records the wedging process."""

from __future__ import annotations

import fcntl
import os

import pytest

from services.explorer.engines.fault_hook import AT_ENV, LOCK_ENV, wedge_hook


def _locked(path) -> bool:
    """Whether some open file description holds an exclusive flock on `path`."""
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def test_the_hook_wedges_one_batch_at_its_version_and_no_other(tmp_path, monkeypatch):
    lock, marker = tmp_path / "wedge.lock", tmp_path / "wedge.lock.wedged"
    monkeypatch.delenv(LOCK_ENV, raising=False)
    with wedge_hook(5):  # off by default: nothing taken, nothing written
        pass
    assert not marker.exists() and not lock.exists()

    monkeypatch.setenv(LOCK_ENV, str(lock))
    monkeypatch.setenv(AT_ENV, "2")
    with wedge_hook(1):  # before its version
        assert not marker.exists() and not _locked(lock)
    with wedge_hook(2):
        assert _locked(lock)
        pid, at = marker.read_text().split()
        assert int(pid) == os.getpid() and float(at) > 0
    assert not _locked(lock)  # given back after the batch
    with wedge_hook(3):  # once per run: the marker stays, no later batch takes the lock
        assert not _locked(lock)
    assert marker.read_text().split()[0] == pid


def test_a_batch_that_raises_gives_the_lock_back(tmp_path, monkeypatch):
    lock = tmp_path / "wedge.lock"
    monkeypatch.setenv(LOCK_ENV, str(lock))
    monkeypatch.delenv(AT_ENV, raising=False)  # default: from model version 1
    with pytest.raises(RuntimeError), wedge_hook(1):
        assert _locked(lock)
        raise RuntimeError("the batch failed")
    assert not _locked(lock)
