"""The veRL key -> RFT Mesh key table: one-to-one keys (`DIRECT`), keys that have no equivalent here
and why (`NO_EQUIVALENT`, by key or by key prefix), and veRL's own defaults for the keys whose meaning
a run depends on (`VERL_DEFAULTS`: a script that leaves out `data.train_batch_size` trains on 1024
prompts per step in veRL, so the converted config says 1024 too; those in `RULE_DEFAULTS` are written by
a rule, only where they matter). Keys that need several veRL keys at once (algorithm, KL, batches, data
files, over-long prompts, GPUs, checkpoint cadence) are converted in rules_training.py and rules_run.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

A, R, C, D, T = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "critic.", "data.", "trainer."


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


@dataclass(frozen=True)
class Direct:
    target: str
    transform: Callable[[Any], Any] | None = None


DIRECT: dict[str, Direct] = {
    "actor_rollout_ref.model.path": Direct("model.model_path"),
    "critic.model.path": Direct("model.critic_model_path"),
    "actor_rollout_ref.model.custom_chat_template": Direct("model.custom_chat_template"),
    R + "temperature": Direct("model.temperature"),
    R + "top_p": Direct("model.top_p"),
    R + "top_k": Direct("model.top_k"),
    R + "max_model_len": Direct("model.max_model_len"),
    D + "max_prompt_length": Direct("model.max_prompt_tokens"),
    D + "max_response_length": Direct("model.max_response_tokens"),
    A + "optim.lr": Direct("algorithm.optimizer.lr"),
    A + "optim.lr_warmup_steps": Direct("algorithm.optimizer.lr_warmup_steps"),
    A + "optim.lr_warmup_steps_ratio": Direct("algorithm.optimizer.lr_warmup_steps_ratio"),
    A + "optim.min_lr_ratio": Direct("algorithm.optimizer.min_lr_ratio"),
    A + "optim.warmup_style": Direct("algorithm.optimizer.lr_scheduler_type"),
    A + "optim.lr_scheduler_type": Direct("algorithm.optimizer.lr_scheduler_type"),
    A + "optim.weight_decay": Direct("algorithm.optimizer.weight_decay"),
    A + "optim.betas": Direct("algorithm.optimizer.betas"),
    A + "optim.optimizer": Direct("algorithm.optimizer.optimizer_type", _lower),
    A + "optim.clip_grad": Direct("trainer.grad_clip"),
    A + "grad_clip": Direct("trainer.grad_clip"),
    A + "ppo_epochs": Direct("algorithm.ppo_epochs"),
    A + "clip_ratio": Direct("algorithm.policy_loss_fn_args.clip_ratio"),
    A + "clip_ratio_low": Direct("algorithm.policy_loss_fn_args.clip_ratio_low"),
    A + "clip_ratio_high": Direct("algorithm.policy_loss_fn_args.clip_ratio_high"),
    A + "clip_ratio_c": Direct("algorithm.policy_loss_fn_args.clip_ratio_c"),
    A + "loss_agg_mode": Direct("algorithm.loss_agg_mode"),
    A + "entropy_coeff": Direct("algorithm.entropy_loss_fn_args.entropy_coef"),
    A + "ppo_micro_batch_size_per_gpu": Direct("trainer.micro_batch_size_per_gpu"),
    A + "use_dynamic_bsz": Direct("trainer.use_dynamic_bsz"),
    A + "ppo_max_token_len_per_gpu": Direct("trainer.max_token_len_per_gpu"),
    A + "ulysses_sequence_parallel_size": Direct("trainer.ulysses_sequence_parallel_size"),
    R + "n": Direct("algorithm.repeat_times"),
    R + "tensor_model_parallel_size": Direct("explorer.rollout_model.tensor_parallel_size"),
    R + "gpu_memory_utilization": Direct("explorer.rollout_model.gpu_memory_utilization"),
    R + "enforce_eager": Direct("explorer.rollout_model.enforce_eager"),
    R + "enable_chunked_prefill": Direct("explorer.rollout_model.enable_chunked_prefill"),
    R + "enable_prefix_caching": Direct("explorer.rollout_model.enable_prefix_caching"),
    R + "dtype": Direct("explorer.rollout_model.dtype"),
    D + "train_batch_size": Direct("buffer.batch_size"),
    T + "total_epochs": Direct("buffer.total_epochs"),
    T + "total_training_steps": Direct("buffer.total_steps"),
    T + "val_before_train": Direct("explorer.eval_on_startup"),
    T + "project_name": Direct("project"),
    T + "experiment_name": Direct("name"),
    T + "max_actor_ckpt_to_keep": Direct("trainer.max_checkpoints_to_keep"),
    T + "nnodes": Direct("cluster.node_num"),
    T + "n_gpus_per_node": Direct("cluster.gpu_per_node"),
    # DAPO: dynamic sampling and the reward manager with its overlong buffer
    "algorithm.filter_groups.enable": Direct("algorithm.filter_groups.enable"),
    "algorithm.filter_groups.metric": Direct("algorithm.filter_groups.metric"),
    "algorithm.filter_groups.max_num_gen_batches": Direct("algorithm.filter_groups.max_num_gen_batches"),
    "reward_model.reward_manager": Direct("algorithm.reward_manager"),
    **{
        f"reward_model.overlong_buffer.{k}": Direct(f"algorithm.reward_manager_args.overlong_buffer.{k}")
        for k in ("enable", "len", "penalty_factor", "log")
    },
    # veRL keys the trainer reads under trainer.trainer_config (see compat.TRAINER_CONFIG_KEYS)
    C + "optim.warmup_style": Direct("trainer.trainer_config.critic.optim.lr_scheduler_type"),
    **{
        key: Direct(f"trainer.trainer_config.{key}")
        for key in (
            "actor_rollout_ref.model.enable_gradient_checkpointing",
            A + "fsdp_config.param_offload",
            A + "fsdp_config.optimizer_offload",
            "actor_rollout_ref.ref.fsdp_config.param_offload",
        )
    },
}

# veRL defaults (verl/trainer/config/ppo_trainer.yaml) where this project's default means otherwise.
VERL_DEFAULTS: dict[str, Any] = {
    D + "train_batch_size": 1024,
    D + "max_prompt_length": 512,
    D + "max_response_length": 512,
    A + "ppo_mini_batch_size": 256,
    A + "use_dynamic_bsz": False,
    A + "ppo_max_token_len_per_gpu": 16384,  # written by rules_training.batches with use_dynamic_bsz only
    A + "optim.min_lr_ratio": 0.0,  # here 0.01 (Trinity-RFT's); it shapes the cosine schedule's end
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,  # here off unless set
    R + "n": 1,
    R + "tensor_model_parallel_size": 2,  # vLLM/SGLang only; rules_run.gpus reads it
    C + "optim.lr": 1e-5,  # here the critic takes the actor's lr; rules_training.algorithm writes it for gae
    T + "total_epochs": 30,
}
# defaults that a rule writes, only where they matter (convert._direct leaves them alone)
RULE_DEFAULTS = frozenset({A + "ppo_max_token_len_per_gpu", R + "tensor_model_parallel_size", C + "optim.lr"})


@dataclass(frozen=True)
class NoEquivalent:
    """Why a veRL key has no equivalent; with the value `same` it needs none (this project does that anyway)."""

    reason: str
    same: Any = None


_PACKED = NoEquivalent("the trainer always packs rows without padding (varlen attention)", same=True)
_FSDP = NoEquivalent(
    "the trainer shards every decoder layer with FSDP2; of fsdp_config it reads the actor's param_offload "
    "and optimizer_offload and the reference's param_offload only"
)
_LOGPROB = NoEquivalent("log-prob passes use the trainer's micro-batches (trainer.micro_batch_size_per_gpu)")
_CRITIC_BATCH = NoEquivalent("the critic uses the actor's micro-batches (trainer.micro_batch_size_per_gpu)")
_ENGINE = NoEquivalent("the rollout engine's own tuning is not exposed")

NO_EQUIVALENT: dict[str, NoEquivalent] = {
    "actor_rollout_ref.model.use_remove_padding": _PACKED,
    "critic.model.use_remove_padding": _PACKED,
    "reward_model.model.use_remove_padding": _PACKED,
    A + "fsdp_config.": _FSDP,
    "actor_rollout_ref.ref.fsdp_config.": _FSDP,
    C + "model.fsdp_config.": _FSDP,
    "reward_model.model.fsdp_config.": _FSDP,
    R + "log_prob_": _LOGPROB,
    "actor_rollout_ref.ref.log_prob_": _LOGPROB,
    C + "ppo_micro_batch_size": _CRITIC_BATCH,
    C + "ppo_micro_batch_size_per_gpu": _CRITIC_BATCH,
    C + "ppo_max_token_len_per_gpu": _CRITIC_BATCH,
    C + "forward_max_token_len_per_gpu": _CRITIC_BATCH,
    C + "use_dynamic_bsz": _CRITIC_BATCH,
    **{
        key: NoEquivalent(
            "sequence parallelism is not implemented here, for the actor, the reference or the critic; "
            "trainer.max_token_len_per_gpu bounds a micro-batch's memory",
            same=1,
        )
        for key in (
            C + "ulysses_sequence_parallel_size",
            "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
        )
    },
    C + "model.enable_gradient_checkpointing": NoEquivalent(
        "activation checkpointing is set for the actor only "
        "(trainer.trainer_config.actor_rollout_ref.model.enable_gradient_checkpointing)"
    ),
    A + "ppo_micro_batch_size": NoEquivalent(
        "deprecated in veRL; set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    ),
    A + "optim.total_training_steps": NoEquivalent("the schedule's length comes from the data and epochs"),
    D + "return_raw_chat": NoEquivalent("prompts stay chat messages; the explorer applies the chat template"),
    D + "val_batch_size": NoEquivalent("evaluation runs every task of the eval tasksets"),
    D + "dataloader_num_workers": NoEquivalent("the explorer reads tasksets in its own process"),
    D + "reward_fn_key": NoEquivalent("the math workflow picks the scorer by each row's `data_source`"),
    T + "critic_warmup": NoEquivalent("the critic trains from the first step, as veRL with 0", same=0),
    T + "device": NoEquivalent("each service takes the GPUs `rft run` gives it"),
    T + "balance_batch": NoEquivalent("micro-batches are balanced by tokens only with use_dynamic_bsz"),
    T + "log_val_generations": NoEquivalent("evaluation logs metrics, not samples"),
    T + "val_only": NoEquivalent("use `mode: bench` to evaluate checkpoints"),
    T + "resume_from_path": NoEquivalent("runs resume from their own job folder (continue_from_checkpoint)"),
    "actor_rollout_ref.hybrid_engine": NoEquivalent("rollout and training always run as separate services"),
    R + "mode": NoEquivalent("the explorer always samples asynchronously"),
    R + "free_cache_engine": _ENGINE,
    R + "load_format": _ENGINE,
    R + "layered_summon": _ENGINE,
    R + "max_num_batched_tokens": _ENGINE,
    R + "max_num_seqs": _ENGINE,
    R + "disable_log_stats": _ENGINE,
    R + "engine_kwargs.": _ENGINE,
    R + "do_sample": NoEquivalent("sampling follows model.temperature (0 = greedy)", same=True),
    R + "multi_turn.": NoEquivalent("multi-turn rollouts are workflows here (default_workflow_type)"),
    R + "agent.": NoEquivalent("multi-turn rollouts are workflows here (default_workflow_type)"),
    "reward_model.": NoEquivalent("the reward model is declared as explorer.auxiliary_models[0] only"),
    "custom_reward_function.": NoEquivalent(
        "name a scorer as buffer.explorer_input.default_reward_fn_type (`pkg.module:function`)"
    ),
    "ray_init.": NoEquivalent("there is no Ray: `rft run` starts the services as processes"),
}


def no_equivalent(key: str) -> NoEquivalent:
    """The reason for `key` (by exact key, else the longest matching prefix ending in `.` or `_`)."""
    if key in NO_EQUIVALENT:
        return NO_EQUIVALENT[key]
    prefixes = [p for p in NO_EQUIVALENT if p[-1] in "._" and key.startswith(p)]
    if prefixes:
        return NO_EQUIVALENT[max(prefixes, key=len)]
    return NoEquivalent("not a key this converter knows")
