"""`rft convert-verl` on the two veRL scripts of Trinity-RFT's "Align configuration with veRL" guide
(tests/fixtures/convert_verl): the converted config loads, and it means the same run as
the Trinity-RFT YAML the guide gives beside each script, field by field, except for the differences
listed below with their reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launcher.convert_verl import convert_script
from services.common.config import RFTConfig, load_config, resolve
from services.common.config.loader import config_warnings
from services.trainer.algorithms.registries import get_advantage_fn, get_policy_loss_fn
from services.trainer.settings import TrainerSettings, unused_trainer_config_keys

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "convert_verl"
ENV = {"HOME": "/home/user"}


def meaning(config: RFTConfig) -> dict[str, Any]:
    """What a run does, as the services read it (resolved view and trainer settings)."""
    r, s = resolve(config), TrainerSettings.from_config(config)
    p, sync, rollout = s.preset, config.synchronizer, config.explorer.rollout_model
    steps_per_sync = sync.sync_interval
    return {
        "algorithm_type": config.algorithm.algorithm_type,
        "advantage_fn": get_advantage_fn(p.advantage_fn) if p.advantage_fn else None,
        "advantage_fn_args": dict(p.advantage_fn_args),
        "policy_loss_fn": get_policy_loss_fn(p.policy_loss_fn),
        "policy_loss_fn_args": dict(p.policy_loss_fn_args),
        "kl_penalty_fn": p.kl_penalty_fn,
        "kl_loss_fn": p.kl_loss_fn,
        "kl_loss_coef": p.kl_loss_fn_args.get("kl_coef"),
        "entropy_coef": p.entropy_loss_fn_args.get("entropy_coef"),
        "loss_agg_mode": p.loss_agg_mode,
        "use_critic": s.use_critic,
        "use_reference": s.use_reference,
        "repeat_times": config.algorithm.repeat_times,
        # batch sizes, in what they do: prompts rolled out per weight version, rows per optimizer step,
        # optimizer steps per weight version
        "prompts_per_weight_version": config.buffer.batch_size * steps_per_sync,
        "experiences_per_optimizer_step": s.mini_batch_size,
        "optimizer_steps_per_weight_version": (s.train_batch_size // s.mini_batch_size)
        * s.ppo_epochs
        * steps_per_sync,
        "sync_offset": sync.sync_offset,
        "sync_timeout": sync.sync_timeout,
        "lr": s.actor_optim.lr,
        "lr_warmup_ratio": s.actor_optim.warmup_ratio,
        "critic_lr": s.critic_optim.lr,
        "critic_lr_warmup_ratio": s.critic_optim.warmup_ratio,
        "grad_clip": s.actor_optim.grad_clip,
        "max_prompt_tokens": config.model.max_prompt_tokens,
        "max_response_tokens": config.model.max_response_tokens,
        "enable_prompt_truncation": config.model.enable_prompt_truncation,
        "temperature": s.temperature,
        "total_epochs": config.buffer.total_epochs,
        "save_interval": s.save_interval,
        "prompts_per_checkpoint": s.save_interval * config.buffer.batch_size,
        "eval_interval": config.explorer.eval_interval,
        "prompts_per_eval": config.explorer.eval_interval * config.buffer.batch_size,
        "eval_on_startup": config.explorer.eval_on_startup,
        "eval_temperature": [r.temperature(t) for t in config.buffer.explorer_input.eval_tasksets],
        "node_num": config.cluster.node_num,
        "gpu_per_node": config.cluster.gpu_per_node,
        "gpu_split": r.gpu_split,
        "trainer_ranks": config.trainer.nproc,
        "engine_type": rollout.engine_type,
        "tensor_parallel_size": rollout.tensor_parallel_size,
        "gpu_memory_utilization": rollout.gpu_memory_utilization,
        "auxiliary_models": [m.model_path for m in config.explorer.auxiliary_models],
        "use_dynamic_bsz": s.use_dynamic_bsz,
        "micro_batch_size": s.micro_batch_size,
        "max_tokens_per_micro_batch": s.max_tokens_per_micro_batch,
        "gradient_checkpointing": getattr(s, "gradient_checkpointing", None),
        "model_path": s.model_path,
        "critic_model_path": s.critic_model_path,
        "tasksets": [t.name for t in r.tasksets],
        "eval_tasksets": [t.name for t in config.buffer.explorer_input.eval_tasksets],
        "taskset_paths": [t.path for t in r.tasksets],
        "shuffle": [t.data_selector.selector_type for t in r.tasksets],
        "response_key": [t.format.response_key for t in r.tasksets],
        "monitor_type": config.monitor.monitor_type,
        "project": config.project,
        "name": config.name,
        "job_dir": str(r.job_dir),
    }


# Differences between the converted config and the guide's Trinity-RFT YAML: field -> (converted, Trinity, why).
WHY = {
    "engine_type": "the Trinity YAML relies on Trinity-RFT's default engine, vllm; this project's default is hf, "
    "so the conversion writes veRL's rollout.name=vllm out",
    "sync_offset": "veRL is strictly on-policy; the guide says sync_offset=0 matches veRL but its YAML uses 1",
    "sync_timeout": "a Trinity-RFT-only setting of the guide's YAML (veRL has none); the default stays",
    "trainer_ranks": "Trinity-RFT's trainer takes every GPU left by itself; here trainer.nproc says so",
    "prompts_per_checkpoint": "the guide keeps save_freq's number (20) while its trainer step is one mini-batch of "
    "256 prompts; the conversion keeps veRL's cadence, every 20 steps of 1024 prompts",
    "prompts_per_eval": "as prompts_per_checkpoint, for test_freq=5",
    "eval_temperature": "veRL validates greedily by default (val_kwargs.do_sample=False); the Trinity YAML samples "
    "at the training temperature",
    "taskset_paths": "veRL names parquet files, which this project reads directly; the Trinity YAML names the "
    "folder and a split",
    "shuffle": "veRL shuffles the training data by default (data.shuffle=True); the Trinity YAML reads in order",
    "response_key": "the Trinity YAML guesses a column ('Check the dataset format'); veRL keeps the answer in "
    "reward_model.ground_truth, which the conversion leaves to the user (a note says so)",
    "enable_prompt_truncation": "veRL's data.filter_overlong_prompts=True drops an over-long prompt; the "
    "Trinity YAML cuts it to its last tokens (enable_prompt_truncation: true), which this project trains on, "
    "so the conversion writes false: the prompt's task is skipped",
    "use_dynamic_bsz": "veRL's default is use_dynamic_bsz=False (micro-batches of ppo_micro_batch_size_per_gpu); "
    "the Trinity YAML inherits Trinity-RFT's default, true",
}
HOME = "/home/user"
EXPECTED = {
    "run_qwen2-7b_rm.sh": {
        "engine_type": ("vllm", "hf"),
        "sync_offset": (0, 1),
        "sync_timeout": (3600, 1200),
        "trainer_ranks": (4, 1),
        "prompts_per_checkpoint": (20 * 1024, 20 * 256),
        "prompts_per_eval": (5 * 1024, 5 * 256),
        "eval_temperature": ([0.0, 0.0], [1.0, 1.0]),
        "taskset_paths": (
            [f"{HOME}/data/gsm8k/train.parquet", f"{HOME}/data/math/train.parquet"],
            [f"{HOME}/data/gsm8k", f"{HOME}/data/math"],
        ),
        "shuffle": (["shuffle", "shuffle"], ["sequential", "sequential"]),
        "response_key": (["response", "response"], ["answer", "answer"]),
        "use_dynamic_bsz": (False, True),
        "enable_prompt_truncation": (False, True),
    },
    "run_deepseek7b_llm_seq_balance.sh": {
        "engine_type": ("vllm", "hf"),
        "sync_offset": (0, 1),
        "sync_timeout": (3600, 1200),
        "trainer_ranks": (6, 1),
        "prompts_per_checkpoint": (20 * 1024, 20 * 256),
        "prompts_per_eval": (5 * 1024, 5 * 256),
        "eval_temperature": ([0.0], [1.0]),
        "taskset_paths": ([f"{HOME}/data/gsm8k/train.parquet"], [f"{HOME}/data/gsm8k"]),
        "shuffle": (["shuffle"], ["sequential"]),
        "response_key": (["response"], ["answer"]),
        "enable_prompt_truncation": (False, True),
    },
}
TRINITY = {"run_qwen2-7b_rm.sh": "ppo_trinity.yaml", "run_deepseek7b_llm_seq_balance.sh": "grpo_trinity.yaml"}


def _convert(script: str) -> str:
    [conversion] = convert_script((FIXTURES / script).read_text(), script)
    return conversion.yaml


@pytest.mark.parametrize("script", sorted(TRINITY))
def test_converted_seed_loads(script):
    config = load_config(text=_convert(script), environ=ENV)
    assert unused_trainer_config_keys(config) == []  # every trainer_config key it writes is read
    assert config_warnings(config) == []  # and no key that has no effect here
    TrainerSettings.from_config(config)  # the trainer accepts the algorithm and batch sizes


@pytest.mark.parametrize("script", sorted(TRINITY))
def test_converted_seed_means_the_trinity_yaml(script, monkeypatch):
    monkeypatch.setenv("HOME", HOME)
    ours = meaning(load_config(text=_convert(script)))
    theirs = meaning(load_config(FIXTURES / TRINITY[script]))
    expected = EXPECTED[script]
    assert set(expected) <= set(WHY), "every expected difference has its reason"
    for field, value in ours.items():
        if field in expected:
            assert (value, theirs[field]) == expected[field], f"{field}: {WHY[field]}"
        else:
            assert value == theirs[field], f"{field}: converted {value!r}, Trinity-RFT {theirs[field]!r}"


def test_seed_batch_meaning_in_numbers(monkeypatch):
    """veRL's GRPO step: 1024 prompts x 8 samples with one weight version, four optimizer steps of 256 x 8."""
    monkeypatch.setenv("HOME", HOME)
    m = meaning(load_config(text=_convert("run_deepseek7b_llm_seq_balance.sh")))
    assert m["prompts_per_weight_version"] == 1024
    assert m["experiences_per_optimizer_step"] == 256 * 8
    assert m["optimizer_steps_per_weight_version"] == 4
    assert m["gpu_split"] == {"total": 8, "rollout": 2, "auxiliary": 0, "trainer": 6}
