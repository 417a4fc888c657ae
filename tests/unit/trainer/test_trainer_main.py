"""`python -m services.trainer` becomes torchrun with `trainer.nproc` ranks (same arguments), so a
compose service or a k8s pod runs the trainer's ranks with the plain service command."""

from __future__ import annotations

import sys

import yaml

from services.trainer.__main__ import _ranks_wanted, torchrun_command


def test_one_rank_runs_as_it_is_and_several_under_torchrun():
    argv = ["--config", "/etc/rft/run.yaml", "--port-file", "/tmp/p"]
    assert torchrun_command(1, argv) is None
    assert torchrun_command(4, argv) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
        "-m", "services.trainer", *argv,
    ]  # fmt: skip


def test_the_ranks_come_from_the_config_and_its_overrides(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"nproc": 2}}))
    assert _ranks_wanted(["--config", str(config)]) == 2
    assert _ranks_wanted(["--config", str(config), "--set", "trainer.nproc=3", "--port", "1"]) == 3
    assert _ranks_wanted(["--config", str(tmp_path / "missing.yaml")]) == 1  # service_main reports it
    assert _ranks_wanted(["--help"]) == 1
