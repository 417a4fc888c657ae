"""`TrainerSettings`: every number the trainer needs, derived once from the run config.

The config tree keeps Trinity-RFT names (`algorithm.*`, `trainer.*`, `model.*`) and lets veRL-style
keys ride along in `trainer.trainer_config`.  This module is the single place where both are read:
the rest of the trainer sees one frozen record and never looks at the raw config.  veRL keys that
are understood (a mini-batch is counted in prompts there, so it is multiplied by `repeat_times`):

    actor_rollout_ref.actor.ppo_mini_batch_size          prompts per optimizer step
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu  rows per micro-batch (fixed batching)
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu    token budget of a dynamic micro-batch
    actor_rollout_ref.actor.use_dynamic_bsz              overrides trainer.use_dynamic_bsz
    actor_rollout_ref.model.enable_gradient_checkpointing recompute activations in the backward pass
    actor_rollout_ref.actor.fsdp_config.param_offload    the policy's shards, grads and optimizer step
                                                          on the CPU (FSDP2 CPUOffloadPolicy)
    actor_rollout_ref.actor.fsdp_config.optimizer_offload the optimizer state on the CPU between updates
    actor_rollout_ref.ref.fsdp_config.param_offload      the reference model's shards on the CPU
    critic.optim.{lr,lr_warmup_steps,lr_warmup_steps_ratio,min_lr_ratio,lr_scheduler_type,weight_decay}
    critic.cliprange_value, critic.grad_clip
    algorithm.kl_ctrl.{type,kl_coef,target_kl,horizon}   the reward-KL controller (merged into
                                                          algorithm.kl_penalty_fn_args, which wins)
    seed                                                  RNG seed of the trainer (42)

veRL keys with a first-class key here are refused at load, other keys load with a warning
(services/common/config/compat.py; listed by `unused_trainer_config_keys`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from services.common.config import OptimizerConfig, RFTConfig, resolve
from services.common.config.compat import TRAINER_CONFIG_KEYS
from services.common.config.sync_plan import SyncPlan
from services.trainer.algorithms import AlgorithmPreset, RolloutISConfig, resolve_preset
from services.trainer.lora import LoraSettings
from services.weight_sync.method import SyncMethod, sync_method

__all__ = ["OptimSettings", "TrainerSettings", "unused_trainer_config_keys"]

DEFAULT_TOKEN_BUDGET = 16384
# veRL key in trainer_config -> kl_penalty_fn_args key
_VERL_KL_CTRL = {
    "algorithm.kl_ctrl.type": "kl_ctrl",
    "algorithm.kl_ctrl.kl_coef": "kl_coef",
    "algorithm.kl_ctrl.target_kl": "target_kl",
    "algorithm.kl_ctrl.horizon": "horizon",
}
_KNOWN_KEYS = TRAINER_CONFIG_KEYS  # the list lives beside the config tree (compat.py)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= _flatten(value, name + ".")
        else:
            out[name] = value
    return out


def unused_trainer_config_keys(config: RFTConfig) -> list[str]:
    """veRL keys in `trainer.trainer_config` that this trainer does not read."""
    return sorted(set(_flatten(config.trainer.trainer_config)) - _KNOWN_KEYS)


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """One optimizer and its LR schedule (actor or critic)."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    warmup_steps: int = -1  # < 0: use warmup_ratio
    warmup_ratio: float = 0.0
    scheduler: str = "constant"  # constant | cosine
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0

    def warmup_for(self, total_steps: int) -> int:
        """Warm-up steps: explicit, else ratio x total steps."""
        return self.warmup_steps if self.warmup_steps >= 0 else int(self.warmup_ratio * total_steps)

    @classmethod
    def from_config(cls, opt: OptimizerConfig, grad_clip: float) -> OptimSettings:
        return cls(
            lr=opt.lr,
            betas=tuple(opt.betas),  # type: ignore[arg-type]
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            warmup_steps=opt.lr_warmup_steps,
            warmup_ratio=opt.lr_warmup_steps_ratio,
            scheduler=opt.lr_scheduler_type,
            min_lr_ratio=opt.min_lr_ratio,
            grad_clip=grad_clip,
        )


@dataclasses.dataclass(frozen=True)
class TrainerSettings:
    """The resolved trainer settings.  Sizes are in experiences (rows) unless named `*_tokens`."""

    model_path: str
    critic_model_path: str
    job_dir: Path
    preset: AlgorithmPreset
    train_batch_size: int
    mini_batch_size: int
    ppo_epochs: int
    micro_batch_size: int
    use_dynamic_bsz: bool
    max_tokens_per_micro_batch: int
    temperature: float
    actor_optim: OptimSettings
    critic_optim: OptimSettings
    cliprange_value: float
    total_steps: int | None
    save_interval: int
    save_hf_checkpoint: str
    max_checkpoints_to_keep: int | None
    resume: bool
    seed: int = 42
    # trainer.replay_keep_steps / replay_keep_bytes: per-step records for `rft replay` (replay_record.py)
    replay_keep_steps: int = 0
    replay_keep_bytes: int | None = None
    dtype: str = "auto"
    # recompute the policy's activations in the backward pass (less memory, same gradients)
    gradient_checkpointing: bool = False
    # trainer.logits_chunk_tokens: the LM head over this many tokens at a time; 0: all logits at once
    logits_chunk_tokens: int = 4096
    # trainer.defer_grad_sync: several ranks reduce gradients once per optimizer step (fsdp.accumulate);
    # None: only where the unsharded gradients cost little (`defers_grad_sync`)
    defer_grad_sync: bool | None = None
    # on a GPU shared with the rollout engine (one-GPU mode): the trainer's cap on its CUDA allocator,
    # 1 - the engine's share - a margin (resolved.py `trainer_gpu_memory_fraction`), and its cache is
    # emptied after each step and weight gather so the engine can wake; None on a GPU of its own
    cuda_memory_fraction: float | None = None
    # veRL's fsdp_config offload switches (services/trainer/worker.py; no-ops in a plain CPU process)
    param_offload: bool = False
    optimizer_offload: bool = False
    ref_param_offload: bool = False
    # the buffer's capacity (experiences): batches held unacked until a durable step count against it
    buffer_capacity: int = 10_000
    # the rollout's response length cap (the DAPO reward manager's default max_resp_len)
    max_response_tokens: int | None = None
    rollout_correction: RolloutISConfig = RolloutISConfig()
    # model.lora_configs[0]: train a LoRA adapter on the frozen policy (services/trainer/lora.py)
    lora: LoraSettings | None = None
    # synchronizer.sync_method, resolved once from its name (services/weight_sync/method.py)
    sync_method: SyncMethod = dataclasses.field(default_factory=lambda: sync_method("nccl"))
    # synchronizer.sync_style/interval/offset and the staleness bound (services/common/config/sync_plan.py)
    sync_plan: SyncPlan = SyncPlan()

    @property
    def use_reference(self) -> bool:
        """A frozen reference model exists only when some KL term or the policy loss (DPO) reads it."""
        p = self.preset
        return p.reads_reference or (p.use_reference and (p.use_kl_loss or p.use_kl_in_reward))

    @property
    def rows_per_experience(self) -> int:
        """Rows one leased experience becomes: 2 for a pairwise loss (DPO: chosen, rejected), else 1.
        `train_batch_size` counts experiences (pairs); mini- and micro-batch sizes count rows and are
        doubled for pairs, as Trinity-RFT doubles DPO's micro-batch size."""
        return 2 if self.preset.pairwise else 1

    def defers_grad_sync(self, world_size: int, device_type: str, lora: bool) -> bool:
        """Whether a model's micro-batches reduce their gradients once per step (`fsdp.accumulate`):
        with several ranks, as set, or when unset for a LoRA adapter or on the CPU (a full model on
        GPUs would hold its unsharded fp32 gradients on every rank)."""
        if world_size < 2:
            return False
        return self.defer_grad_sync if self.defer_grad_sync is not None else lora or device_type == "cpu"

    @property
    def use_critic(self) -> bool:
        return self.preset.use_critic

    @property
    def recompute_old_log_probs(self) -> bool:
        """Whether a step starts with a no-grad pass for the old log-probs.

        Not needed when the batch gets exactly one optimizer step (one epoch, one mini-batch) and no
        reward KL reads them: the old policy then *is* the current one before its step, so the update's
        own forward pass gives them (detached), as TRL does with `num_iterations=1`; the ratio is 1
        and the gradient is the same.  This saves one forward pass over the batch per step.
        """
        rows = self.train_batch_size * self.rows_per_experience
        one_update = self.ppo_epochs == 1 and self.mini_batch_size >= rows
        if self.preset.reads_reference and not self.preset.use_kl_in_reward:
            return False  # DPO's loss reads the reference, never the old policy
        return not one_update or self.preset.use_kl_in_reward or self.rollout_correction.enabled

    @classmethod
    def from_config(cls, config: RFTConfig) -> TrainerSettings:
        res = resolve(config)
        alg, tr = config.algorithm, config.trainer
        extra = _flatten(tr.trainer_config)
        preset = _preset(alg, extra)
        train_bs = res.train_batch_size
        mini_bs = _mini_batch_rows(extra, alg.repeat_times, train_bs, preset.pairwise)
        tasksets = res.tasksets
        temperature = (res.temperature(tasksets[0]) if tasksets else config.model.temperature) or 1.0
        actor_optim = OptimSettings.from_config(alg.optimizer, tr.grad_clip)
        critic_optim = _critic_optim(extra, actor_optim, tr.grad_clip)
        return cls(
            model_path=config.model.model_path,
            critic_model_path=res.critic_model_path,
            job_dir=res.job_dir,
            preset=preset,
            train_batch_size=train_bs,
            mini_batch_size=mini_bs,
            ppo_epochs=alg.ppo_epochs,
            micro_batch_size=int(
                extra.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", tr.micro_batch_size_per_gpu)
            ),
            use_dynamic_bsz=bool(extra.get("actor_rollout_ref.actor.use_dynamic_bsz", tr.use_dynamic_bsz)),
            max_tokens_per_micro_batch=int(
                extra.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
                or res.max_token_len_per_gpu
                or DEFAULT_TOKEN_BUDGET
            ),
            temperature=float(temperature),
            actor_optim=actor_optim,
            critic_optim=critic_optim,
            cliprange_value=float(extra.get("critic.cliprange_value", 0.5)),
            total_steps=res.total_steps,
            save_interval=tr.save_interval,
            save_hf_checkpoint=tr.save_hf_checkpoint,
            max_checkpoints_to_keep=tr.max_checkpoints_to_keep,
            resume=config.continue_from_checkpoint,
            replay_keep_steps=tr.replay_keep_steps,
            replay_keep_bytes=tr.replay_keep_bytes,
            seed=int(extra.get("seed", 42)),
            gradient_checkpointing=bool(
                extra.get("actor_rollout_ref.model.enable_gradient_checkpointing", False)
            ),
            logits_chunk_tokens=tr.logits_chunk_tokens,
            defer_grad_sync=tr.defer_grad_sync,
            cuda_memory_fraction=res.trainer_gpu_memory_fraction,
            param_offload=bool(extra.get("actor_rollout_ref.actor.fsdp_config.param_offload", False)),
            optimizer_offload=bool(extra.get("actor_rollout_ref.actor.fsdp_config.optimizer_offload", False)),
            ref_param_offload=bool(extra.get("actor_rollout_ref.ref.fsdp_config.param_offload", False)),
            buffer_capacity=config.buffer.trainer_input.experience_buffer.capacity,
            max_response_tokens=(res.response_limit(tasksets[0]) if tasksets else res.max_response_tokens),
            rollout_correction=RolloutISConfig.from_section(alg),  # veRL's algorithm.rollout_is* keys
            lora=LoraSettings.from_config(config.model.lora_configs[0])
            if config.model.lora_configs
            else None,
            sync_method=sync_method(config.synchronizer.sync_method, config.synchronizer.wire_dtype),
            sync_plan=res.sync_plan,
        )


def requested_sync_method(name: str) -> SyncMethod:
    """The method a SyncWeights request names (a registered name or alias; an unknown one raises
    `UnknownNameError` listing the known ones): with `from_config`, the trainer's one look-up of a
    method by name (the request's wire string)."""
    return sync_method(name)


def _preset(alg: Any, extra: dict[str, Any]) -> AlgorithmPreset:
    """The algorithm's preset with the config's explicit choices (and veRL's kl_ctrl keys) on top."""
    overrides = {
        name: getattr(alg, name)
        for name in (
            "advantage_fn",
            "advantage_fn_args",
            "kl_penalty_fn",
            "kl_penalty_fn_args",
            "policy_loss_fn",
            "policy_loss_fn_args",
            "kl_loss_fn",
            "kl_loss_fn_args",
            "entropy_loss_fn",
            "entropy_loss_fn_args",
            "loss_agg_mode",
            "reward_manager",
            "reward_manager_args",
        )
    }
    overrides["repeat_times"] = alg.repeat_times
    verl_kl = {arg: extra[key] for key, arg in _VERL_KL_CTRL.items() if key in extra}
    if verl_kl:
        overrides["kl_penalty_fn_args"] = verl_kl | dict(alg.kl_penalty_fn_args or {})
    return resolve_preset(alg.algorithm_type, overrides)


def _mini_batch_rows(extra: dict[str, Any], repeat_times: int, train_bs: int, pairwise: bool) -> int:
    """Rows per mini-batch: veRL's ppo_mini_batch_size x repeat_times (default: the whole batch)."""
    mini = extra.get("actor_rollout_ref.actor.ppo_mini_batch_size")
    mini_bs = int(mini) * repeat_times if mini else train_bs
    if train_bs % mini_bs:
        raise ValueError(
            f"train batch size {train_bs} is not a multiple of the mini-batch size {mini_bs} "
            "(trainer_config actor_rollout_ref.actor.ppo_mini_batch_size x repeat_times)"
        )
    return mini_bs * (2 if pairwise else 1)  # rows: a pair experience is two rows


def _critic_optim(extra: dict[str, Any], actor_optim: OptimSettings, grad_clip: float) -> OptimSettings:
    """The critic's optimizer: the actor's, with veRL's critic.optim.* keys on top."""
    return dataclasses.replace(
        actor_optim,
        lr=float(extra.get("critic.optim.lr", actor_optim.lr)),
        warmup_steps=int(extra.get("critic.optim.lr_warmup_steps", actor_optim.warmup_steps)),
        warmup_ratio=float(extra.get("critic.optim.lr_warmup_steps_ratio", actor_optim.warmup_ratio)),
        min_lr_ratio=float(extra.get("critic.optim.min_lr_ratio", actor_optim.min_lr_ratio)),
        scheduler=str(extra.get("critic.optim.lr_scheduler_type", actor_optim.scheduler)),
        weight_decay=float(extra.get("critic.optim.weight_decay", actor_optim.weight_decay)),
        grad_clip=float(extra.get("critic.grad_clip", grad_clip)),
    )
