"""GPU placement (Trinity-RFT's rule) as a pure function: explorers take engine_num x
tensor_parallel_size plus their local auxiliary models, the trainer the rest; misfits name the numbers;
the config check refuses them at load; inside an explorer, engines and auxiliary models follow the
same order. No GPU needed: the GPU count is a number."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import ConfigError, ExplorerConfig, load_config, resolve
from services.common.config.gpus import (
    GpuDemand,
    GpuPlacementError,
    explorer_gpu_count,
    explorer_layout,
    gpu_demand,
    place_gpus,
)

ROOT = Path(__file__).resolve().parents[3]


def _demand(engine_num=1, tp=1, aux=0, ranks=1) -> GpuDemand:
    return GpuDemand(engine_num=engine_num, tensor_parallel_size=tp, auxiliary=aux, trainer_ranks=ranks)


def test_the_gsm8k_example_puts_vllm_on_gpu_0_and_the_trainer_on_gpu_1():
    config = load_config(ROOT / "examples" / "gsm8k_grpo.yaml", environ={})
    placement = resolve(config).gpu_placement
    assert placement.explorers == ((0,),) and placement.trainer == (1,)


def test_trinity_example_rollout_and_reward_model_then_the_trainer():
    """Trinity-RFT's PPO mapping: 8 GPUs, rollout 2 engines, a reward model on 2: the trainer gets 4."""
    config = load_config(ROOT / "examples" / "verl_mapping" / "ppo_example.yaml", environ={})
    demand = gpu_demand(config)
    assert (demand.rollout, demand.auxiliary, demand.explorer) == (2, 2, 4)
    placement = place_gpus(8, demand)
    assert placement.explorers == ((0, 1, 2, 3),) and placement.trainer == (4, 5, 6, 7)
    assert placement.idle_trainer_gpus == 3  # trainer.nproc 1 of its 4 GPUs


def test_several_explorers_get_consecutive_blocks():
    placement = place_gpus(7, _demand(engine_num=1, tp=2, ranks=3), explorers=2)
    assert placement.explorers == ((0, 1), (2, 3)) and placement.trainer == (4, 5, 6)
    assert placement.idle_trainer_gpus == 0


def test_modes_without_a_trainer_or_without_explorers():
    assert place_gpus(4, _demand(ranks=4), mode="train").trainer == (0, 1, 2, 3)
    assert place_gpus(4, _demand(ranks=4), mode="train").explorers == ()
    explore = place_gpus(2, _demand(engine_num=2), mode="explore")
    assert explore.explorers == ((0, 1),) and explore.trainer == ()
    assert place_gpus(1, _demand(), mode="bench").explorers == ((0,),)


def test_no_gpus_declared_places_nothing():
    placement = place_gpus(0, _demand(engine_num=8), explorers=3)
    assert placement.explorers == ((), (), ()) and placement.trainer == ()


def test_nothing_left_for_the_trainer_names_the_numbers():
    with pytest.raises(GpuPlacementError) as err:
        place_gpus(2, _demand(engine_num=2))
    msg = str(err.value)
    assert "the 2 there are" in msg
    assert "1 explorer(s) x (2 rollout engine(s) x tensor_parallel_size 1) = 2 GPU(s)" in msg
    assert "the trainer needs 1" in msg and "0 are left" in msg
    assert "raise cluster.gpu_per_node" in msg and "engine_num" in msg


def test_trainer_ranks_need_a_gpu_each():
    with pytest.raises(
        GpuPlacementError, match=r"trainer needs 2 \(trainer.nproc 2.*1 is left.*lower trainer.nproc"
    ):
        place_gpus(3, _demand(aux=1, ranks=2))
    with pytest.raises(GpuPlacementError, match="3 explorer"):
        place_gpus(3, _demand(), explorers=3, mode="both")
    with pytest.raises(GpuPlacementError, match="= 3 GPU"):
        place_gpus(2, _demand(tp=3), mode="explore")


def test_the_config_check_refuses_a_misfit_at_load():
    text = (
        "cluster: {gpu_per_node: 2}\n"
        "explorer: {rollout_model: {engine_type: vllm, engine_num: 1, tensor_parallel_size: 2}}\n"
    )
    with pytest.raises(ConfigError, match="2 rollout engine|tensor_parallel_size 2"):
        load_config(text=text, environ={})
    with pytest.raises(ConfigError, match=r"trainer.nproc 2"):
        load_config(text="cluster: {gpu_per_node: 2}\ntrainer: {nproc: 2}\n", environ={})
    # train mode: the trainer has every GPU
    ok = load_config(text="mode: train\ncluster: {gpu_per_node: 2}\ntrainer: {nproc: 2}\n", environ={})
    assert resolve(ok).gpu_placement.trainer == (0, 1)


def test_auxiliary_models_behind_an_api_take_no_gpu_and_the_layout_follows_the_order():
    explorer = ExplorerConfig(
        rollout_model={"engine_type": "vllm", "engine_num": 2, "tensor_parallel_size": 2},
        auxiliary_models=[
            {"model_path": "/m/judge", "engine_num": 1, "tensor_parallel_size": 1},
            {"api_base": "http://judge:8000/v1", "name": "remote"},
            {"model_path": "/m/rm", "tensor_parallel_size": 2},
        ],
    )
    assert explorer_gpu_count(explorer) == 2 * 2 + 1 + 2
    assert explorer_layout(explorer) == ([0, 2], [4, None, 5])
