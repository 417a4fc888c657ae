"""A checkpoint save on a full disk (a real 40 MiB tmpfs, filled by the test): the save fails cleanly with
the cause named, its folder is removed, the previous checkpoint stays the latest; once space returns the
same step saves and loads. Needs root (it mounts the tmpfs); skips loudly otherwise."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.trainer.checkpoint import MARKER, SaveFailed

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(
            f"!!! cannot mount a small tmpfs ({done.stderr.strip()}): the full-disk save test is SKIPPED"
        )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, leave_bytes: int) -> Path:
    """A ballast file that leaves `leave_bytes` free on `disk`."""
    st = os.statvfs(disk)
    ballast = disk / "ballast"
    with ballast.open("wb") as fh:
        fh.truncate(0)
        fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave_bytes))
    return ballast


def test_a_save_on_a_full_disk_fails_cleanly_and_the_step_saves_once_space_returns(tmp_path, small_disk):
    from services.trainer.collate import collate
    from services.trainer.distributed import ensure_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings
    from tests.support.trainer_data import make_config, make_experiences

    torch.set_num_threads(1)
    config = make_config(make_tiny_model(tmp_path / "tiny"), small_disk)
    engine = FSDPEngine(TrainerSettings.from_config(config), ensure_process_group())
    job = small_disk / "rft-mesh" / "t"
    try:
        engine.train_step(collate(make_experiences(8, group_size=4, seed=1)))
        engine.save_checkpoint(1, {"global_step": 1}, save_as_hf=False, block=True)
        assert (job / MARKER).read_text() == "1"

        engine.train_step(collate(make_experiences(8, group_size=4, seed=2)))
        weights = dict(engine.iter_state_dict())
        ballast = _fill(small_disk, leave_bytes=2 << 20)  # room for a part of the step's ~13 MB
        with pytest.raises(SaveFailed) as failed:
            engine.save_checkpoint(2, {"global_step": 2}, save_as_hf=False, block=True)
        message = str(failed.value)
        assert "the checkpoint save of step 2" in message and "No space left on device" in message, message
        assert "the disk is full" in message and "step 1 stays the latest checkpoint" in message, message
        assert (job / MARKER).read_text() == "1"  # the marker never moved
        assert not (job / "global_step_2").exists()  # the partial folder gave its space back
        assert (job / "global_step_1" / "actor" / "model.safetensors").is_file()

        ballast.unlink()  # space returns: the same step saves, and loads back exactly
        engine.save_checkpoint(2, {"global_step": 2}, save_as_hf=False, block=True)
        assert (job / MARKER).read_text() == "2"
        state = engine.load_checkpoint(str(job / "global_step_2"))
        assert state["global_step"] == 2
        for name, w in engine.iter_state_dict():
            assert torch.equal(w, weights[name]), name
    finally:
        engine.close()
