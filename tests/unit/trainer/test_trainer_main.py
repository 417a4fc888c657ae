"""`python -m services.trainer` becomes torchrun with `trainer.nproc` ranks (same arguments), so a
compose service or a k8s pod runs the trainer's ranks with the plain service command."""

from __future__ import annotations

import sys

import pytest
import yaml

from services.trainer.__main__ import _trainer_shape, main, torchrun_command
from services.trainer.nodes import NodeError, node_place


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
    assert _trainer_shape(["--config", str(config)]) == (2, 1)
    assert _trainer_shape(["--config", str(config), "--set", "trainer.nproc=3", "--port", "1"]) == (3, 1)
    assert _trainer_shape(["--config", str(config), "--set", "trainer.nnodes=2"]) == (2, 2)
    assert _trainer_shape(["--config", str(tmp_path / "missing.yaml")]) == (1, 1)  # service_main reports it
    assert _trainer_shape(["--help"]) == (1, 1)


def test_each_node_of_a_multi_node_trainer_meets_node_0_by_static_rendezvous():
    argv = ["--config", "/etc/rft/run.yaml"]
    env = {
        "RFT_TRAINER_NODE_RANK": "1",
        "RFT_TRAINER_MASTER_ADDR": "trainer",
        "RFT_TRAINER_MASTER_PORT": "29400",
    }
    assert torchrun_command(1, argv, node_place(2, env)) == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=1", "--master_addr=trainer",
        "--master_port=29400", "--nproc_per_node=1", "-m", "services.trainer", *argv,
    ]  # fmt: skip
    # a Kubernetes indexed Job gives the node rank; the port defaults to torchrun's
    place = node_place(3, {"JOB_COMPLETION_INDEX": "2", "RFT_TRAINER_MASTER_ADDR": "trainer-0.trainer"})
    assert (place.node_rank, place.master_port) == (2, 29500)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RFT_TRAINER_MASTER_ADDR": "trainer"}, "set RFT_TRAINER_NODE_RANK"),
        ({"RFT_TRAINER_NODE_RANK": "2", "RFT_TRAINER_MASTER_ADDR": "trainer"}, "use 0 .. 1"),
        ({"RFT_TRAINER_NODE_RANK": "x", "RFT_TRAINER_MASTER_ADDR": "trainer"}, "must be an integer"),
        ({"RFT_TRAINER_NODE_RANK": "1"}, "set RFT_TRAINER_MASTER_ADDR"),
        (
            {"RFT_TRAINER_NODE_RANK": "1", "RFT_TRAINER_MASTER_ADDR": "a", "RFT_TRAINER_MASTER_PORT": "0"},
            "port",
        ),
    ],
)
def test_a_node_that_does_not_know_its_place_is_told_what_to_set(env, says):
    with pytest.raises(NodeError, match=says):
        node_place(2, env)


def test_the_service_command_exits_2_naming_the_variable(tmp_path, monkeypatch, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"trainer": {"nnodes": 2}}))
    for var in ("RANK", "RFT_TRAINER_NODE_RANK", "JOB_COMPLETION_INDEX", "RFT_TRAINER_MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    assert main(["--config", str(config)]) == 2
    assert "RFT_TRAINER_NODE_RANK" in capsys.readouterr().err
