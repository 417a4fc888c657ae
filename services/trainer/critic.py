"""The PPO critic: a value head on the policy's decoder (veRL `DataParallelPPOCritic`).

`ValueModel` is the decoder body of a causal LM (`load_model(...).model`, the LM head dropped) plus
a linear value head, so it loads from the same HF folder (`model.critic_model_path`, defaulting to
the policy).  The value of response token t is read at the position that predicts it (the state
before the token), as veRL does with its ``[-R-1:-1]`` slice.  The critic has its own optimizer
and LR (`critic.optim.*` in `trainer_config`), value clipping (`critic.cliprange_value`, 0.5) and the
same mini/micro/dynamic batching and loss scaling as the actor.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from services.trainer.actor import agg_normaliser
from services.trainer.algorithms import compute_value_loss, masked_mean
from services.trainer.collate import StepBatch, pack
from services.trainer.distributed import DistInfo
from services.trainer.fsdp import accumulate, clip_grad_norm, reshard_after_inference
from services.trainer.rowwise import MicroBatching, local_micro_batches, map_rows
from services.trainer.settings import TrainerSettings
from services.trainer.varlen_attention import load_packed_model

__all__ = ["Critic", "ValueModel", "load_value_model"]


class ValueModel(nn.Module):
    """Decoder body + ``Linear(hidden, 1)``; `forward` returns values at the given positions ``(N,)``."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.v_head = nn.Linear(hidden_size, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.normal_(self.v_head.weight, std=1.0 / math.sqrt(hidden_size + 1))
        nn.init.zeros_(self.v_head.bias)

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.layers

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        states = hidden.last_hidden_state[0, positions]
        return self.v_head(states).squeeze(-1).to(torch.float32, copy=True)


def load_value_model(path: str, dtype: str = "float32", seed: int = 42) -> ValueModel:
    """A `ValueModel` from an HF causal-LM folder (value head initialised from `seed`)."""
    lm = load_packed_model(path, dtype=dtype)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return ValueModel(lm.model, lm.config.hidden_size)
    finally:
        torch.random.set_rng_state(generator_state)


def value_forward(module: nn.Module, micro: StepBatch, device: torch.device) -> torch.Tensor:
    """Values ``(rows, response_length)`` of the response tokens of `micro`."""
    packed = pack(micro).to(device)
    values = module(packed.input_ids, packed.position_ids, packed.logit_positions)
    return packed.unpack(values)


class Critic:
    """Value model + optimizer; every method is collective over the data-parallel ranks."""

    def __init__(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, settings: TrainerSettings, info: DistInfo
    ):
        self.module = module
        self.optimizer = optimizer
        self.settings = settings
        self.info = info
        self.batching = MicroBatching(
            settings.micro_batch_size,
            settings.max_tokens_per_micro_batch if settings.use_dynamic_bsz else None,
        )

    @torch.no_grad()
    def compute_values(self, step: StepBatch) -> torch.Tensor:
        self.module.eval()
        try:
            return map_rows(
                step, self.info, self.batching, lambda m: value_forward(self.module, m, self.info.device)
            )
        finally:
            reshard_after_inference(self.module)
            self.module.train()

    def update_critic(self, step: StepBatch) -> dict[str, float]:
        """Clipped value regression of `values` towards `returns`; returns `critic/*` metrics."""
        step.batch.require("returns")
        step.batch.require("values")
        self.module.train()
        # the optimizer holds the sharded leaf parameters; `module.parameters()` may list FSDP2's
        # temporary unsharded tensors while a group is unsharded
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        mode = self.settings.preset.loss_agg_mode
        world, dev = self.info.world_size, self.info.device
        sums = torch.zeros(3, dtype=torch.float64)  # vf_loss, vf_clipfrac, vpred_mean
        norms: list[float] = []
        for _ in range(self.settings.ppo_epochs):
            for start in range(0, step.size, self.settings.mini_batch_size):
                mini = step.rows(range(start, min(start + self.settings.mini_batch_size, step.size)))
                global_norm = agg_normaliser(mini.batch.response_mask, mode)
                global_tokens = max(float(mini.batch.response_mask.sum()), 1.0)
                self.optimizer.zero_grad(set_to_none=True)
                micro_batches = local_micro_batches(mini, self.info, self.batching)
                defer = self.settings.defers_grad_sync(world, dev.type, lora=False)
                for rows in accumulate(self.module, micro_batches, defer):
                    micro = mini.rows(rows)
                    b = micro.batch
                    mask = b.response_mask.to(dev)
                    vpreds = value_forward(self.module, micro, dev)
                    vf_loss, clipfrac = compute_value_loss(
                        vpreds, b.returns.to(dev), b.values.to(dev), mask, self.settings.cliprange_value, mode
                    )
                    scale = agg_normaliser(b.response_mask, mode) / global_norm if global_norm else 0.0
                    (vf_loss * (scale * world)).backward()
                    share = float(b.response_mask.sum()) / global_tokens
                    sums += torch.tensor(
                        [
                            float(vf_loss.detach()) * scale,
                            float(clipfrac) * share,
                            float(masked_mean(vpreds.detach(), mask)) * share,
                        ],
                        dtype=torch.float64,
                    )
                grad_norm = clip_grad_norm(params, self.settings.critic_optim.grad_clip)
                norms.append(grad_norm)
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    self.optimizer.zero_grad(set_to_none=True)
        if world > 1:  # CPU float64 sums: the gloo side of the default group (`backend_for`)
            dist.all_reduce(sums)
        avg = (sums / max(1, len(norms))).tolist()
        finite = [n for n in norms if math.isfinite(n)]
        return {
            "critic/vf_loss": avg[0],
            "critic/vf_clipfrac": avg[1],
            "critic/vpred_mean": avg[2],
            "critic/grad_norm": sum(finite) / len(finite) if finite else float("nan"),
            "critic/lr": float(self.optimizer.param_groups[0]["lr"]),
        }
