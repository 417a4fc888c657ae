"""The policy: log-prob recomputation and `update_policy` (veRL `DataParallelPPOActor`).

Log-probs and entropy are computed on logits divided by the rollout temperature, so they are those
of the distribution that sampled the responses.  `update_policy` loops `ppo_epochs` x mini-batches
(one optimizer step each) x micro-batches (fixed rows or a token budget).

Loss scaling under gradient accumulation.  A policy loss aggregates over the micro-batch it sees
(`agg_loss`).  To make the accumulated gradient equal to the gradient of the loss over the whole
global mini-batch, each micro-batch loss is scaled by

    scale = n_local / n_global x world_size

where n is the mode's normaliser (masked tokens for `token-mean`, non-empty sequences for the
`seq-mean-*` modes, the padded response length for `seq-mean-token-sum-norm`, which is the same for
every micro-batch) and world_size undoes FSDP's gradient averaging across ranks.  So 4 micro-batches,
dynamic batches and 2 ranks all give the one-big-batch gradient (tested).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from services.common import tracing
from services.trainer.algorithms import (
    agg_loss,
    compute_kl_loss,
    get_policy_loss_fn,
    logprobs_and_entropy,
    logprobs_from_logits,
    rollout_probs_diff,
)
from services.trainer.chunked_logprobs import chunked_logprobs, hidden_at_logits, supports_hidden_path
from services.trainer.collate import ModelShape, StepBatch, model_inputs, pack
from services.trainer.distributed import DistInfo
from services.trainer.fsdp import accumulate, clip_grad_norm, reshard_after_inference
from services.trainer.lora import is_lora, reference_mode
from services.trainer.rowwise import MicroBatching, local_micro_batches, map_rows
from services.trainer.settings import TrainerSettings

__all__ = ["Actor", "agg_normaliser", "policy_forward"]

_TOKEN_WEIGHTED = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")


def policy_forward(
    module: nn.Module,
    micro: StepBatch,
    temperature: float,
    device: torch.device,
    entropy: bool = False,
    entropy_grad: bool = False,
    shape: ModelShape | None = None,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens of `micro`, ``(rows, response_length)``.

    The LM head runs only at the positions that predict response tokens; log-probs and entropy
    share one logsumexp (`logprobs_and_entropy`), and the entropy carries a gradient only with
    `entropy_grad` (a non-zero entropy coefficient), otherwise it is a no-grad metric.  With the
    module's `shape` the rows are packed or padded, whichever is cheaper (`collate.model_inputs`);
    without it they are packed.  `chunk_tokens` > 0: the LM head runs on that many tokens at a time
    (`chunked_logprobs`; the same numbers, one chunk's logits in memory); 0: all logits at once.
    """
    packed = (pack(micro) if shape is None else model_inputs(micro, shape)).to(device)
    labels = packed.labels.to(device)
    if chunk_tokens > 0 and supports_hidden_path(module):
        hidden = hidden_at_logits(module, packed)
        lp, ent = chunked_logprobs(module, hidden, labels, temperature, chunk_tokens, entropy, entropy_grad)
        return packed.unpack(lp), None if ent is None else packed.unpack(ent)
    if packed.packed:
        out = module(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            logits_to_keep=packed.logit_positions,
            use_cache=False,
        )
    else:
        out = module(input_ids=packed.input_ids, attention_mask=packed.attention_mask, use_cache=False)
    logits = packed.select_logits(out.logits).float()  # (N, vocab)
    if temperature != 1.0:
        logits = logits / temperature
    if not entropy:
        return packed.unpack(logprobs_from_logits(logits, labels)), None
    log_probs, ent = logprobs_and_entropy(logits, labels, entropy_grad=entropy_grad)
    return packed.unpack(log_probs), packed.unpack(ent)


def agg_normaliser(mask: torch.Tensor, loss_agg_mode: str) -> float:
    """The denominator `agg_loss` uses for this mask (see the module docstring)."""
    if loss_agg_mode == "token-mean":
        return float(mask.sum())
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return 1.0
    return float((mask.sum(dim=-1) > 0).sum())


class Actor:
    """Policy model + optimizer; every method is collective over the data-parallel ranks."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        settings: TrainerSettings,
        info: DistInfo,
        adapters_disabled: bool = False,
    ):
        self.module = module
        # the LoRA policy as its own reference: log-probs with the adapters switched off
        self.adapters_disabled = adapters_disabled
        self.optimizer = optimizer
        self.settings = settings
        self.info = info
        preset = settings.preset
        self.loss_fn = get_policy_loss_fn(preset.policy_loss_fn)
        self.loss_cfg: Mapping[str, Any] = preset.policy_loss_fn_args
        # DPO: the loss's first argument is the reference log-probs, not the old policy's
        self.loss_reads_ref = bool(getattr(self.loss_fn, "reads_reference", False))
        self.loss_agg_mode = preset.loss_agg_mode
        self.entropy_coef = (
            float(preset.entropy_loss_fn_args.get("entropy_coef", 0.0))
            if preset.entropy_loss_fn != "none"
            else 0.0
        )
        self.kl_coef = float(preset.kl_loss_fn_args.get("kl_coef", 0.0)) if preset.use_kl_loss else 0.0
        self.shape = ModelShape.of(module)
        # several ranks: one gradient reduce-scatter per optimizer step (`fsdp.accumulate`)
        self.defer_sync = settings.defers_grad_sync(info.world_size, info.device.type, is_lora(module))
        self.batching = MicroBatching(
            settings.micro_batch_size,
            settings.max_tokens_per_micro_batch if settings.use_dynamic_bsz else None,
            unit_rows=settings.rows_per_experience,
        )

    @torch.no_grad()
    def compute_log_prob(self, step: StepBatch) -> torch.Tensor:
        """Log-probs ``(bs, response_length)`` of every response token under this module."""
        was_training = self.module.training
        self.module.eval()
        try:
            with reference_mode(self.module) if self.adapters_disabled else contextlib.nullcontext():
                return map_rows(
                    step,
                    self.info,
                    self.batching,
                    lambda micro: policy_forward(
                        self.module,
                        micro,
                        self.settings.temperature,
                        self.info.device,
                        shape=self.shape,
                        chunk_tokens=self.settings.logits_chunk_tokens,
                    )[0],
                )
        finally:
            reshard_after_inference(self.module)
            self.module.train(was_training)

    def update_policy(self, step: StepBatch) -> dict[str, float]:
        """PPO-style update on a batch that carries old_log_probs and advantages (and ref_log_probs
        when a KL loss is used); returns the averaged `actor/*` metrics."""
        assert self.optimizer is not None, "a reference actor has no optimizer"
        batch = step.batch
        if self.settings.recompute_old_log_probs:
            batch.require("old_log_probs")
        if self.kl_coef or self.loss_reads_ref:
            batch.require("ref_log_probs")
        self.module.train()
        # the optimizer holds the sharded leaf parameters; `module.parameters()` may list FSDP2's
        # temporary unsharded tensors while a group is unsharded
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        mini = self.settings.mini_batch_size
        sums = torch.zeros(6, dtype=torch.float64)  # pg_loss, clipfrac, ppo_kl, entropy, kl_loss, clip_lower
        diff = torch.zeros(3, dtype=torch.float64)  # sum |p_rollout - p_old|, tokens, max
        extra: dict[str, float] = {}  # the loss's own metrics (DPO rewards), weighted by loss share
        norms: list[float] = []
        skipped = 0
        for _ in range(self.settings.ppo_epochs):
            for start in range(0, step.size, mini):
                mini_batch = step.rows(range(start, min(start + mini, step.size)))
                metrics, grad_norm = self._mini_batch_step(mini_batch, params, diff, extra)
                sums += metrics
                norms.append(grad_norm)
                skipped += 0 if math.isfinite(grad_norm) else 1
        extra_keys = sorted(extra)
        if self.info.world_size > 1:  # the same keys on every rank, even from a plug-in loss
            gathered: list[list[str] | None] = [None] * self.info.world_size
            dist.all_gather_object(gathered, extra_keys)
            extra_keys = sorted({k for keys in gathered for k in keys or ()})
        extra_sums = torch.tensor([extra.get(k, 0.0) for k in extra_keys], dtype=torch.float64)
        if self.info.world_size > 1:  # CPU float64 sums: the gloo side of the default group (`backend_for`)
            dist.all_reduce(extra_sums)
            dist.all_reduce(sums)
            dist.all_reduce(diff[:2])
            dist.all_reduce(diff[2:], op=dist.ReduceOp.MAX)
        n_updates = max(1, len(norms))
        avg = (sums / n_updates).tolist()
        finite = [n for n in norms if math.isfinite(n)]
        rollout = (
            {
                "training/rollout_probs_diff_mean": float(diff[0] / diff[1]),
                "training/rollout_probs_diff_max": float(diff[2]),
            }
            if diff[1] > 0
            else {}
        )
        rollout |= dict(zip(extra_keys, (extra_sums / n_updates).tolist(), strict=True))
        return rollout | {
            "actor/pg_loss": avg[0],
            "actor/pg_clipfrac": avg[1],
            "actor/ppo_kl": avg[2],
            "actor/entropy": avg[3],
            "actor/kl_loss": avg[4],
            "actor/pg_clipfrac_lower": avg[5],
            "actor/kl_coef": self.kl_coef,
            "actor/grad_norm": sum(finite) / len(finite) if finite else float("nan"),
            "actor/skipped_updates": float(skipped),
            "actor/lr": float(self.optimizer.param_groups[0]["lr"]),
        }

    def _micro_loss(
        self, micro: StepBatch, diff: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """One micro-batch's forward and loss: (loss, pg_loss, entropy loss, kl_loss, the policy loss
        function's metrics); its rollout-vs-old probability differences are added to `diff`."""
        mode, dev = self.loss_agg_mode, self.info.device
        b = micro.batch
        mask = b.response_mask.to(dev)
        log_prob, entropy = policy_forward(
            self.module,
            micro,
            self.settings.temperature,
            dev,
            entropy=True,
            entropy_grad=self.entropy_coef != 0.0,
            shape=self.shape,
            chunk_tokens=self.settings.logits_chunk_tokens,
        )
        assert entropy is not None
        # one update per batch: the policy before this step is the old policy (settings)
        old = b.old_log_probs.to(dev) if b.old_log_probs is not None else log_prob.detach()
        if b.rollout_log_probs is not None:
            part = rollout_probs_diff(b.rollout_log_probs.to(dev), old, mask)
            diff[:2] += part[:2]
            diff[2] = max(diff[2], part[2])
        baseline = b.require("ref_log_probs").to(dev) if self.loss_reads_ref else old
        pg_loss, pg_metrics = self.loss_fn(
            baseline,
            log_prob,
            b.advantages.to(dev) if b.advantages is not None else None,
            mask,
            mode,
            dict(self.loss_cfg),
            b.rollout_is_weights.to(dev) if b.rollout_is_weights is not None else None,
        )
        ent_loss = agg_loss(entropy, mask, mode)
        loss = pg_loss - self.entropy_coef * ent_loss if self.entropy_coef else pg_loss
        kl_loss = torch.zeros((), device=dev)
        if self.kl_coef:
            kl_loss, _ = compute_kl_loss(
                log_prob, b.ref_log_probs.to(dev), mask, self.settings.preset.kl_loss_fn, mode
            )
            loss = loss + self.kl_coef * kl_loss
        return loss, pg_loss, ent_loss, kl_loss, pg_metrics

    def _mini_batch_step(
        self, mini: StepBatch, params: list[nn.Parameter], diff: torch.Tensor, extra: dict[str, float]
    ) -> tuple[torch.Tensor, float]:
        """Accumulate the micro-batch gradients of one mini-batch, clip, step.

        `diff` accumulates the rollout-vs-old probability differences ``[sum, count, max]`` in place;
        `extra` the loss function's other metrics, each weighted by its micro-batch's loss share.

        Returns the six summed metrics (see `update_policy`) and the grad norm.  The loss metrics
        stay tensors on the device until the end of the mini-batch (one transfer, not one sync per
        micro-batch); the policy loss functions report their own metrics as floats.
        """
        assert self.optimizer is not None
        mode, world, dev = self.loss_agg_mode, self.info.world_size, self.info.device
        global_mask = mini.batch.response_mask
        global_norm = agg_normaliser(global_mask, mode)
        global_tokens = max(float(global_mask.sum()), 1.0)
        losses = torch.zeros(3, dtype=torch.float64, device=dev)  # pg_loss, entropy, kl_loss
        loss_fn_metrics = torch.zeros(3, dtype=torch.float64)  # clipfrac, ppo_kl, clipfrac_lower
        self.optimizer.zero_grad(set_to_none=True)
        micro_batches = local_micro_batches(mini, self.info, self.batching)
        with tracing.span("trainer.forward_backward"):
            for rows in accumulate(self.module, micro_batches, self.defer_sync):
                micro = mini.rows(rows)
                b = micro.batch
                loss, pg_loss, ent_loss, kl_loss, pg_metrics = self._micro_loss(micro, diff)
                scale = agg_normaliser(b.response_mask, mode) / global_norm if global_norm else 0.0
                (loss * (scale * world)).backward()
                token_share = float(b.response_mask.sum()) / global_tokens
                for key, value in pg_metrics.items():
                    if key not in _TOKEN_WEIGHTED and key != "actor/pg_loss":
                        extra[key] = extra.get(key, 0.0) + float(value) * scale
                losses += (
                    torch.stack([pg_loss.detach(), ent_loss.detach(), kl_loss.detach()]).double() * scale
                )
                loss_fn_metrics += (
                    torch.tensor(
                        [
                            pg_metrics.get("actor/pg_clipfrac", 0.0),
                            pg_metrics.get("actor/ppo_kl", 0.0),
                            pg_metrics.get("actor/pg_clipfrac_lower", 0.0),
                        ],
                        dtype=torch.float64,
                    )
                    * token_share
                )
        with tracing.span("trainer.optimizer"):
            grad_norm = clip_grad_norm(params, self.settings.actor_optim.grad_clip)
            if math.isfinite(grad_norm):
                self.optimizer.step()
            else:
                self.optimizer.zero_grad(set_to_none=True)
        pg, ent, kl = losses.cpu()
        clipfrac, ppo_kl, clipfrac_lower = loss_fn_metrics
        return torch.stack([pg, clipfrac, ppo_kl, ent, kl, clipfrac_lower]), grad_norm
