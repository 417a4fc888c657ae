"""`rft run` on one GPU, with a simulated GPU count: `gpu_per_node: 1` shows GPU 0 to both the trainer
and the explorer; `gpu_per_node: 0` on a machine with CUDA refuses a run whose weights would cross an
NCCL group between two processes of the first GPU (and changes nothing without CUDA or without such a
group); a run whose memory plan does not fit stops before anything starts (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launcher import run
from launcher.gpus import VISIBLE, HostCuda, host_cuda, one_device_nccl, stage_gpus
from launcher.runner import StageOptions, StageRun
from launcher.stages import run_stages
from services.common.config import load_config
from services.common.config.gpus import GpuPlacementError


def _config(tmp_path: Path, **sections) -> Path:
    tree = {
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tmp_path / "model"), "max_response_tokens": 4},
        **sections,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_one_gpu_is_visible_to_the_trainer_and_the_explorer(tmp_path):
    (stage,) = run_stages(load_config(_config(tmp_path, cluster={"gpu_per_node": 1}), environ={}))
    opts = StageOptions(explorers=1, environ={VISIBLE: "3"}, live=False)
    run_ = StageRun(stage, stage.config.model.model_path, opts, multi_stage=False, label="t")
    env = {p.name: p.env.get(VISIBLE) for wave in run_.waves for p in wave}
    assert env == {"synchronizer": "", "buffer": "", "trainer": "3", "explorer": "3"}
    assert not run_.gpus.warnings
    with pytest.raises(GpuPlacementError, match="2 explorer"):  # two explorers never share it
        stage_gpus(stage.config, explorers=2, environ={})


def test_no_placement_on_a_cuda_machine_refuses_nccl_between_two_processes_of_gpu_0(tmp_path):
    config = load_config(_config(tmp_path), environ={})
    assert config.cluster.gpu_per_node == 0 and config.synchronizer.sync_method == "nccl"
    with pytest.raises(GpuPlacementError) as err:
        stage_gpus(config, explorers=1, environ={}, cuda_devices=1)
    msg = str(err.value)
    assert "shows 1 CUDA device" in msg and "cannot join two processes of one device" in msg
    assert "cluster.gpu_per_node: 1" in msg and "sync_method: memory" in msg


@pytest.mark.parametrize(
    "sections",
    [
        {"synchronizer": {"sync_method": "memory"}},
        {"synchronizer": {"group_backend": "gloo"}},
        {"mode": "explore"},
    ],
)
def test_no_placement_without_an_nccl_group_between_them_runs_as_before(tmp_path, sections):
    config = load_config(_config(tmp_path, **sections), environ={})
    assert one_device_nccl(config, cuda_devices=1) is None
    assert not stage_gpus(config, explorers=1, environ={}, cuda_devices=1).placed


def test_without_cuda_nothing_changes(tmp_path):
    config = load_config(_config(tmp_path), environ={})
    assert one_device_nccl(config, cuda_devices=0) is None
    gpus = stage_gpus(config, explorers=1, environ={})
    assert not gpus.placed and gpus.env("trainer") == {} and gpus.env("explorer") == {}
    assert host_cuda({VISIBLE: ""}) == HostCuda() == host_cuda({VISIBLE: "-1"})


def test_rft_run_stops_before_starting_anything_when_the_memory_plan_does_not_fit(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv(VISIBLE, raising=False)
    model = tmp_path / "model"
    model.mkdir()
    shape = {
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    }  # fmt: skip
    (model / "config.json").write_text(json.dumps(shape))
    code = run(_config(tmp_path, cluster={"gpu_per_node": 1, "gpu_memory_gib": 80}), live=False)
    assert code == 2
    err = capsys.readouterr().err
    assert "the GPUs cannot hold this run" in err and "GPU 0: the trainer and the rollout engine" in err
    assert not (tmp_path / "ckpt").exists()  # no job folder: nothing started
