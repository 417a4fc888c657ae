"""`cluster.colocate` (veRL's hybrid engine): the config rules, the colocated placement, the memory plan
per phase, the sync plan's flag, and `rft convert-verl` on a 2-GPU GRPO + LoRA script (tensor parallel 2)
that `rft config check` accepts with a plan per phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.convert_verl import convert_script
from launcher.memory_plan import memory_plan
from services.common.config import load_config, resolve
from services.common.config.errors import ConfigError
from services.common.config.gpus import GpuDemand, GpuPlacementError, place_gpus

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "fixtures" / "convert_verl" / "run_qwen2_5-3b_gsm8k_grpo_lora.sh"
# Qwen2.5-3B's config.json, the fields the memory plan reads
QWEN25_3B = {
    "model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
}  # fmt: skip
BASE = "model: {max_response_tokens: 8}\n"


def test_colocated_placement_shares_every_gpu_and_refuses_misfits():
    demand = GpuDemand(engine_num=1, tensor_parallel_size=2, auxiliary=0, trainer_ranks=2)
    p = place_gpus(2, demand, colocate=True)
    assert (p.explorers, p.trainer, p.trainer_ranks, p.shared, p.colocated) == (
        ((0, 1),),
        (0, 1),
        2,
        True,
        True,
    )
    assert place_gpus(4, demand, colocate=True, explorers=2).explorers == ((0, 1), (2, 3))
    with pytest.raises(GpuPlacementError, match="trainer.nproc"):
        place_gpus(2, GpuDemand(1, 2, 0, 3), colocate=True)
    assert place_gpus(2, GpuDemand(1, 2, 0, 2), mode="train", colocate=True).trainer == (0, 1)  # an SFT stage
    assert not place_gpus(4, demand).colocated  # without the option: Trinity's split


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ("synchronizer: {sync_offset: 1}", "synchronizer.sync_offset is 1"),
        ("synchronizer: {sync_style: fully_async}", "synchronizer.sync_style is fully_async"),
        ("synchronizer: {sync_style: trainer_driven}", "synchronizer.sync_style is trainer_driven"),
        ("synchronizer: {sync_interval: 2}", "synchronizer.sync_interval is 2"),
        ("mode: serve", "mode serve answers requests while the trainer steps"),
    ],
)
def test_colocate_refuses_plans_whose_phases_overlap(extra, path):
    with pytest.raises(ConfigError) as err:
        load_config(text=f"{BASE}cluster: {{colocate: true}}\n{extra}\n")
    assert path in str(err.value) and "cluster.colocate: false" in str(err.value)


def test_a_stage_of_one_side_is_placed_as_usual():
    r = resolve(load_config(text=BASE + "mode: train\ncluster: {colocate: true, gpu_per_node: 2}\n"))
    assert not r.sync_plan.colocated and not r.gpu_placement.colocated and r.gpu_placement.trainer == (0, 1)


def test_colocated_run_sleeps_its_engines_per_the_sync_plan():
    r = resolve(load_config(text=BASE + "cluster: {colocate: true}\n"))  # on CPU: no GPU placed
    assert r.sync_plan.colocated and r.sync_plan.engines_sleep_after_step()
    assert r.rollout_model.enable_sleep_mode  # the hf engine sleeps too
    assert not resolve(load_config(text=BASE)).sync_plan.engines_sleep_after_step()
    gpu = resolve(load_config(text=BASE + "cluster: {colocate: true, gpu_per_node: 1}\n"))
    assert (gpu.rollout_gpu_memory_utilization, gpu.trainer_gpu_memory_fraction) == (0.5, 0.95)
    assert gpu.weight_sync_backend == "gloo"  # never NCCL between two processes of one device


def test_converted_verl_hybrid_engine_script_is_colocated_and_checked_per_phase(tmp_path):
    [c] = convert_script(SCRIPT.read_text(), SCRIPT.name)
    assert not any("cannot hold both" in w for w in c.warnings)
    model = tmp_path / "qwen2.5-3b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_3B))
    file = tmp_path / "run.yaml"
    file.write_text(c.yaml.replace("Qwen/Qwen2.5-3B-Instruct", str(model)))
    config = load_config(file)
    placement = resolve(config).gpu_placement
    assert config.cluster.colocate and (config.trainer.nproc, config.explorer.rollout_model.engine_num) == (
        2,
        1,
    )
    assert (placement.explorers, placement.trainer, placement.colocated) == (((0, 1),), (0, 1), True)
    assert config.model.lora_configs[0].lora_rank == 64
    plan = memory_plan(config)
    assert list(plan.columns) == ["GPU 0 rollout", "GPU 0 train", "GPU 1 rollout", "GPU 1 train"]
    rollout, train = plan.columns["GPU 0 rollout"], plan.columns["GPU 0 train"]
    assert "rollout (vLLM reserve)" in rollout and "activations" not in rollout  # the trainer rests
    assert "parameters (fp32) (resident)" in rollout and "rollout (vLLM reserve)" not in train
    assert "rollout asleep (CUDA context)" in train and "activations" in train
    assert not plan.problems()
    # on 32 GiB GPUs the rollout phase fits (vLLM reserves its share) but the trainer's step does not
    [problem, *_] = memory_plan(config, capacity_gib=32).problems()
    assert problem.startswith("GPU 0: in the train phase, the trainer and the rollout engine need about 39.9")
    checked = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "config", "check", "--skip-paths", str(file)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert "GPU 0 rollout" in checked.stdout and "GPU 0 train" in checked.stdout and "fits" in checked.stdout
