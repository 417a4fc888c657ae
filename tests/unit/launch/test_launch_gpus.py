"""The GPUs `rft run` gives each child, on CPU with a simulated GPU count (CUDA_VISIBLE_DEVICES in the
environment it passes down, or `cluster.gpu_per_node` alone): explorers first, the trainer the rest,
nothing for the buffer and the synchronizer; misfits stop the run before anything starts (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launcher import run
from launcher.gpus import VISIBLE, host_gpus, stage_gpus
from launcher.runner import StageOptions, StageRun
from launcher.stages import run_stages
from services.common.config import load_config
from services.common.config.gpus import GpuPlacementError

ROOT = Path(__file__).resolve().parents[3]


def _config(tmp_path: Path, **sections) -> Path:
    tree = {
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tmp_path / "model")},
        "cluster": {"gpu_per_node": 4},
        "explorer": {"rollout_model": {"engine_type": "vllm", "engine_num": 1, "tensor_parallel_size": 1}},
        "trainer": {"nproc": 2},
        **sections,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _children_env(config_file: Path, explorers: int, environ: dict[str, str]) -> dict[str, str | None]:
    """CUDA_VISIBLE_DEVICES of every process the stage would start (None: not set)."""
    (stage,) = run_stages(load_config(config_file, environ={}))
    opts = StageOptions(explorers=explorers, environ=environ, live=False)
    run_ = StageRun(stage, stage.config.model.model_path, opts, multi_stage=False, label="t")
    return {p.name: p.env.get(VISIBLE) for wave in run_.waves for p in wave}


def test_each_child_sees_its_own_gpus_of_the_users_visible_set(tmp_path):
    env = _children_env(_config(tmp_path), explorers=2, environ={VISIBLE: "4,5,6,7", "HOME": "/h"})
    assert env == {
        "synchronizer": "",
        "buffer": "",
        "trainer": "6,7",
        "explorer-0": "4",
        "explorer-1": "5",
    }


def test_without_a_visible_set_the_gpus_are_0_to_gpu_per_node(tmp_path):
    env = _children_env(_config(tmp_path, trainer={"nproc": 3}), explorers=1, environ={})
    assert (env["explorer"], env["trainer"]) == ("0", "1,2,3")


def test_the_gsm8k_example_splits_vllm_and_the_trainer():
    config = load_config(ROOT / "examples" / "gsm8k_grpo.yaml", environ={})
    gpus = stage_gpus(config, explorers=1, environ={})
    assert gpus.env("explorer") == {VISIBLE: "0"} and gpus.env("trainer") == {VISIBLE: "1"}
    assert gpus.env("buffer") == {VISIBLE: ""} and not gpus.warnings


def test_no_gpus_declared_leaves_the_environment_alone_and_warns_for_vllm(tmp_path):
    config = load_config(_config(tmp_path, cluster={"gpu_per_node": 0}), environ={})
    gpus = stage_gpus(config, explorers=2, environ={VISIBLE: "0,1"})
    assert gpus.env("trainer") == {} and gpus.env("explorer", 1) == {}
    assert "share the first visible GPU" in gpus.warnings[0]
    env = _children_env(_config(tmp_path, cluster={"gpu_per_node": 0}), 1, {VISIBLE: "0,1"})
    assert set(env.values()) == {"0,1"}  # the user's own setting reaches every child unchanged


def test_idle_trainer_gpus_are_a_warning(tmp_path):
    config = load_config(_config(tmp_path, trainer={"nproc": 1}), environ={})
    (warning,) = stage_gpus(config, explorers=1, environ={}).warnings
    assert "GPUs 1,2,3" in warning and "set trainer.nproc: 3" in warning


def test_misfits_name_the_numbers(tmp_path):
    config = load_config(_config(tmp_path), environ={})
    with pytest.raises(GpuPlacementError, match="3 explorer.*= 3 GPU.*trainer needs 2"):
        stage_gpus(config, explorers=3, environ={})
    with pytest.raises(GpuPlacementError, match=r"gpu_per_node is 4 but CUDA_VISIBLE_DEVICES='0,1' shows 2"):
        stage_gpus(config, explorers=1, environ={VISIBLE: "0,1"})
    assert host_gpus(2, {VISIBLE: " 3, 1 ,0"}) == ["3", "1"]
    two_nodes = load_config(_config(tmp_path, cluster={"node_num": 2, "gpu_per_node": 4}), environ={})
    with pytest.raises(GpuPlacementError, match="cluster.node_num is 2"):
        stage_gpus(two_nodes, explorers=1, environ={})
    trainer_nodes = load_config(
        _config(tmp_path, cluster={"gpu_per_node": 0}, trainer={"nnodes": 2}), environ={}
    )
    with pytest.raises(GpuPlacementError, match="trainer.nnodes is 2.*multi-node compose override"):
        stage_gpus(trainer_nodes, explorers=1, environ={})


def test_rft_run_stops_before_starting_anything_when_gpus_do_not_fit(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(VISIBLE, raising=False)
    code = run(_config(tmp_path), explorers=3, live=False)
    assert code == 2
    assert "trainer needs 2" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()  # no job folder: nothing started
