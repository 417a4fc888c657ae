"""The broadcast's /dev/shm path takes any size the tmpfs has room for: `shm_shortfall` compares the
free space `statvfs` reports with the payload plus its margin (no fixed cap), and says why not (how
much is free and needed, and the fix) when it does not fit. Fake `statvfs` results stand in for a big
or a small /dev/shm; no bytes are written. The real transfer through /dev/shm is in
tests/integration/weight_sync/test_broadcast.py."""

from __future__ import annotations

import os

import pytest

from services.weight_sync.wire.broadcast import shm_margin, shm_shortfall

GIB = 1 << 30


def _statvfs(free_bytes: int, frsize: int = 4096):
    blocks = -(-free_bytes // frsize)  # whole blocks, at least the bytes asked
    # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
    result = os.statvfs_result((frsize, frsize, blocks * 2, blocks, blocks, 1000, 1000, 1000, 0, 255))
    return lambda path: result


def test_a_payload_above_1_gib_fits_a_tmpfs_with_room_for_it():
    payload = int(2.9 * GIB)  # a 1.5B model in bf16
    assert shm_shortfall(payload, statvfs=_statvfs(8 * GIB)) is None
    assert shm_shortfall(payload, statvfs=_statvfs(payload + shm_margin(payload))) is None


def test_a_tmpfs_without_room_says_how_much_and_the_fix():
    payload = int(2.9 * GIB)
    why = shm_shortfall(payload, statvfs=_statvfs(payload))  # the weights but not the margin
    assert why is not None and "has 2.90 GiB free" in why and "--shm-size" in why
    assert shm_shortfall(1 << 20, statvfs=_statvfs(64 << 20)) is None  # docker's default 64 MiB
    assert shm_shortfall(60 << 20, statvfs=_statvfs(64 << 20)) is not None


def test_an_unreadable_path_is_a_shortfall(tmp_path):
    assert "cannot be read" in shm_shortfall(1, path=str(tmp_path / "missing"))


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_the_real_dev_shm_holds_a_small_payload():
    assert shm_shortfall(1 << 20) is None
