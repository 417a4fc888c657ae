"""`FSDPWorker`: what every rank does — build the sharded models and run steps, saves and loads.

Each public method is one collective unit of work: rank 0 calls it directly, the other ranks run
the same method when rank 0's `CommandChannel` broadcasts it.  One train step is

    old log-probs (only when a batch gets several updates, a reward KL or rollout IS; see
    `TrainerSettings.recompute_old_log_probs`) -> reference log-probs (only with a KL term) -> critic values (PPO)
    -> reward shaping + advantages (by name) -> rollout IS correction -> critic update -> actor update
    -> LR schedulers

followed by `compute_data_metrics` and timing / throughput metrics.

Models are wrapped by `fsdp.shard_model`: FSDP2 with several ranks or on CUDA, the plain module in
a single CPU process (`fsdp` forces either; the rest of the code does not depend on the choice).
Sharded models are never whole on the device (`FSDPWorker._build`): every rank shards a meta-device
skeleton and receives its shards of the weights rank 0 loaded on the CPU.  The reference model is
bf16 on CUDA (it is never trained, so it needs no fp32 master).  veRL's `fsdp_config` offload keys
(`TrainerSettings.param_offload`, `optimizer_offload`, `ref_param_offload`) keep the sharded
parameters (FSDP2 `CPUOffloadPolicy`) or the actor's optimizer state (between updates) on the CPU.
On a GPU shared with the rollout engine (`TrainerSettings.cuda_memory_fraction`) the rank caps its
CUDA allocator at its share and empties its cache after each step and weight gather, so the engine
beside it can wake; its startup heap is frozen (`gc.freeze`), so the collection before each release
looks only at what the step made.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from services.common import tracing
from services.common.gpu_memory import cap_cuda_memory, freeze_heap, release_cuda_cache
from services.common.modeling import load_tokenizer
from services.trainer.actor import Actor
from services.trainer.advantage_stage import shape_rewards_and_advantages
from services.trainer.algorithms import apply_rollout_correction, compute_data_metrics, make_kl_controller
from services.trainer.checkpoint import CheckpointManager, Role
from services.trainer.collate import StepBatch, check_pairs
from services.trainer.critic import Critic, ValueModel, load_value_model
from services.trainer.distributed import DistInfo
from services.trainer.fsdp import full_state_dict, materialize, meta_parameters, shard_model, uses_fsdp
from services.trainer.lora import adapter_state_dict, apply_lora, merged_state_dict, save_adapter
from services.trainer.optim import build_optimizer, build_scheduler, move_optimizer_state
from services.trainer.reward_stage import apply_reward_manager, make_reward_manager
from services.trainer.settings import TrainerSettings
from services.trainer.varlen_attention import load_packed_model

__all__ = ["FSDPWorker", "enable_gradient_checkpointing"]


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each layer's activations in the backward pass (non-reentrant checkpointing).
    `activation_checkpointing_enable` is transformers 5's name; older releases (some GPU images)
    have only `gradient_checkpointing_enable`."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextmanager
def _timer(timings: dict[str, float], name: str) -> Iterator[None]:
    """Time a phase of the step into `timing_s/<name>`, under the span `trainer.<name>` when tracing."""
    start = time.perf_counter()
    with tracing.span(f"trainer.{name}"):
        yield
    timings[f"timing_s/{name}"] = timings.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


class FSDPWorker:
    """The models of one rank and the collective operations on them."""

    def __init__(self, settings: TrainerSettings, info: DistInfo, fsdp: bool | None = None):
        self.settings = settings
        self.info = info
        self.fsdp = uses_fsdp(info) if fsdp is None else fsdp
        torch.manual_seed(settings.seed)
        if settings.cuda_memory_fraction is not None:  # a GPU shared with the rollout engine
            cap_cuda_memory(info.device, settings.cuda_memory_fraction)
        dtype = "float32"  # master weights; bf16 compute on CUDA comes from the FSDP2 policy
        self.tokenizer = load_tokenizer(settings.model_path)
        self.pad_token_id = int(self.tokenizer.pad_token_id or 0)

        def policy_model(meta: bool) -> nn.Module:
            policy = load_packed_model(settings.model_path, dtype=dtype, meta=meta)
            if settings.gradient_checkpointing:  # veRL actor_rollout_ref.model.enable_gradient_checkpointing
                enable_gradient_checkpointing(policy)
            if settings.lora is not None:  # wrapped before sharding; only the adapter is trainable
                with warnings.catch_warnings():
                    # a saved adapter (`path`) loads into the skeleton's meta parameters as a no-op
                    # (rank 0's real copy brings the values); torch warns once per tensor
                    warnings.filterwarnings("ignore", ".*copying from a non-meta parameter", UserWarning)
                    policy = apply_lora(policy, settings.lora)
            return policy

        self.policy = self._build(policy_model, offload=settings.param_offload)
        self.hf_config = self.policy.config  # a LoRA wrapper forwards both to the HF model
        self.generation_config = getattr(self.policy, "generation_config", None)
        optim = build_optimizer(self.policy, settings.actor_optim)
        self.actor = Actor(self.policy, optim, settings, info)
        self.actor_scheduler = build_scheduler(optim, settings.actor_optim, settings.total_steps)
        self.ref: Actor | None = None
        if settings.use_reference and settings.lora is not None:  # the policy with adapters disabled
            self.ref = Actor(self.policy, None, settings, info, adapters_disabled=True)
        elif settings.use_reference:
            # never trained: no fp32 master on CUDA (bf16 is what FSDP2 computes in anyway); fp32 on
            # the CPU, where the numbers must not move
            ref_dtype = "bfloat16" if info.device.type == "cuda" else "float32"

            def ref_model(meta: bool) -> nn.Module:
                ref = load_packed_model(settings.model_path, dtype=ref_dtype, meta=meta)
                return ref.requires_grad_(False)

            ref = self._build(ref_model, offload=settings.ref_param_offload)
            self.ref = Actor(ref.eval(), None, settings, info)
        self.critic: Critic | None = None
        self.critic_scheduler = None
        if settings.use_critic:

            def value_model(meta: bool) -> nn.Module:
                if not meta:
                    return load_value_model(settings.critic_model_path, dtype, settings.seed)
                with meta_parameters():
                    lm = load_packed_model(settings.critic_model_path, dtype=dtype, meta=True)
                    return ValueModel(lm.model, lm.config.hidden_size)

            value_module = self._build(value_model)
            critic_optim = build_optimizer(value_module, settings.critic_optim)
            self.critic = Critic(value_module, critic_optim, settings, info)
            self.critic_scheduler = build_scheduler(critic_optim, settings.critic_optim, settings.total_steps)
        self.kl_ctrl = make_kl_controller(settings.preset.kl_penalty_fn_args)
        self.reward_manager = make_reward_manager(
            settings.preset, self.tokenizer, settings.max_response_tokens
        )
        self.checkpoints = CheckpointManager(settings.job_dir, info, settings.max_checkpoints_to_keep)
        if settings.cuda_memory_fraction is not None:  # the release after each step collects only what is new
            freeze_heap()

    def _build(self, load: Callable[[bool], nn.Module], offload: bool = False) -> nn.Module:
        """The sharded module `load(meta)` describes, never whole on the device.

        With FSDP every rank builds the skeleton (`load(True)`: parameters on the meta device) and
        shards it; rank 0 alone loads the weights (`load(False)`, on the CPU) and `fsdp.materialize`
        gives each rank its shards of them.  A plain module (one CPU process) is loaded as it is."""
        if not self.fsdp:
            return load(False).to(self.info.device)
        state = load(False).state_dict() if self.info.is_main else {}
        module = shard_model(load(True), self.info, fsdp=True, offload=offload)
        materialize(module, self.info, state, offload=offload)
        return module

    @contextmanager
    def _optimizer_on_device(self) -> Iterator[None]:
        """With `optimizer_offload`, the actor's optimizer state beside its parameters inside (on the
        device; on the CPU with `param_offload`, where the optimizer step runs), on the CPU after."""
        if not self.settings.optimizer_offload:
            yield
            return
        move_optimizer_state(self.actor.optimizer)
        try:
            yield
        finally:
            move_optimizer_state(self.actor.optimizer, "cpu")

    # ---- one step ---------------------------------------------------------------------------------
    def train_step(self, step: StepBatch) -> dict[str, float]:
        """One optimizer step (or `ppo_epochs` x mini-batches of them) on the global batch."""
        s = self.settings
        timings: dict[str, float] = {}
        start = time.perf_counter()
        batch = step.batch
        if s.preset.pairwise:
            check_pairs(step)
        if s.recompute_old_log_probs:
            with _timer(timings, "old_log_prob"):
                batch = batch.replace(old_log_probs=self.actor.compute_log_prob(step))
        if self.ref is not None:
            with _timer(timings, "ref"):
                batch = batch.replace(ref_log_probs=self.ref.compute_log_prob(step))
        if self.critic is not None:
            with _timer(timings, "values"):
                batch = batch.replace(values=self.critic.compute_values(step))
        with _timer(timings, "reward"):
            batch, reward_metrics = apply_reward_manager(batch, self.reward_manager)
        with _timer(timings, "adv"):
            batch, metrics = shape_rewards_and_advantages(batch, s.preset, self.kl_ctrl)
        # rollout IS weights and rejection for the updates only (`mismatch/*`; advantages and data
        # metrics keep the full mask); a no-op unless algorithm.rollout_is_threshold is set
        update_batch, is_metrics = apply_rollout_correction(batch, s.rollout_correction)
        metrics |= is_metrics | reward_metrics
        step = step.with_batch(update_batch)
        if self.critic is not None:
            with _timer(timings, "update_critic"):
                metrics |= self.critic.update_critic(step)
            assert self.critic_scheduler is not None
            self.critic_scheduler.step()
        with _timer(timings, "update_actor"), self._optimizer_on_device():
            metrics |= self.actor.update_policy(step)
        self.actor_scheduler.step()
        elapsed = time.perf_counter() - start
        tokens = step.num_tokens
        metrics |= compute_data_metrics(batch, use_critic=self.critic is not None)
        metrics |= timings
        metrics |= {
            "timing_s/update": elapsed,
            "perf/total_num_tokens": float(tokens),
            "perf/time_per_step": elapsed,
            "perf/throughput": tokens / elapsed / self.info.world_size,
        }
        if self.ref is not None or s.preset.use_kl_in_reward:
            metrics["actor/reward_kl_penalty_coeff"] = self.kl_ctrl.value
        self._release_shared_gpu()
        return metrics

    def _release_shared_gpu(self) -> None:
        """On a GPU shared with the rollout engine, hand the allocator's cached blocks back, so the
        engine can wake (vLLM's sleep mode) and load weights in them; nothing on a GPU of its own."""
        if self.settings.cuda_memory_fraction is not None:
            release_cuda_cache(self.info.device)

    # ---- checkpoints ------------------------------------------------------------------------------
    def roles(self) -> list[Role]:
        lora = self.settings.lora is not None
        roles = [Role("actor", self.policy, self.actor.optimizer, self.actor_scheduler, lora)]  # type: ignore[arg-type]
        if self.critic is not None:
            roles.append(Role("critic", self.critic.module, self.critic.optimizer, self.critic_scheduler))  # type: ignore[arg-type]
        return roles

    def save_checkpoint(self, request: dict[str, Any]) -> str:
        """Stage and start writing `global_step_<step>`; `request`: step, save_as_hf, trainer_state."""
        state = dict(request["trainer_state"]) | {"kl_coef": self.kl_ctrl.value}
        with self._optimizer_on_device():  # staged (copied) here; written from the copies
            folder = self.checkpoints.save(
                request["step"], self.roles(), state, self.export_hf if request["save_as_hf"] else None
            )
        if request.get("block"):
            self.checkpoints.wait()
        return str(folder)

    def wait_for_save(self, _: Any = None) -> None:
        self.checkpoints.wait()

    def load_checkpoint(self, folder: str) -> dict[str, Any]:
        with self._optimizer_on_device():
            state = self.checkpoints.load(Path(folder), self.roles())
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        return state

    def export_hf(self, out: Path, weights: dict[str, torch.Tensor]) -> None:
        """Write an HF folder (`from_pretrained`-loadable) with the saved tokenizer; with LoRA the
        merged model, and the adapter in `lora_adapter/` (Trinity-RFT's layout)."""
        out.mkdir(parents=True, exist_ok=True)
        if self.settings.lora is not None:
            save_adapter(self.policy, weights, out / "lora_adapter")
            weights = merged_state_dict(self.policy, weights)
        if getattr(self.hf_config, "tie_word_embeddings", False):
            weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
        save_file(
            {k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"), {"format": "pt"}
        )
        self.hf_config.save_pretrained(out)
        if self.generation_config is not None:
            self.generation_config.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        (out / "rft_export.json").write_text(json.dumps({"source": "rft-mesh trainer"}))

    # ---- weights for sync -------------------------------------------------------------------------
    def gather_state_dict(self, kind: Any = None) -> dict[str, torch.Tensor]:
        """Full policy state dict on rank 0 (HF names), empty elsewhere; collective.  In the training
        compute dtype (`weight_gather`), one host copy; `kind` "full@device" leaves it on the training
        device (the nccl method).  With LoRA the adapter is merged into the base weights (the explorer
        loads them under the base names; merged on the host in fp32, then cast), or, `kind`
        "adapter", only the adapter is returned (`lora.adapter_state_dict`)."""
        from services.trainer import weight_gather as wg  # the one gather for weight sync

        what, on_device = wg.parse_kind(kind)  # "full@device": left on the GPU for the nccl method
        dtype = wg.compute_dtype(self.policy)  # the wire dtype: bf16 on CUDA, as trained on CPU
        if self.settings.lora is None:
            out = full_state_dict(self.policy, dtype, None if on_device else "cpu")
        else:
            state = full_state_dict(self.policy)  # the merge reads fp32 A, B and W; cast after it
            if not state:
                out = state
            elif what == wg.ADAPTER:
                out = adapter_state_dict(self.policy, state)
            else:
                out = wg.cast_state(merged_state_dict(self.policy, state), dtype)
        if not on_device:  # the gather's device buffers, back before the engine loads the weights
            self._release_shared_gpu()
        return out
