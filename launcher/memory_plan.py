"""The memory plan: the bytes each GPU of the placement is expected to hold, before anything starts.

Pure arithmetic over the config and the model's `config.json` (read with `json` from the local model
folder; no torch, no download). `rft config show` prints it, `rft config check` and `rft run` refuse a
placement that cannot fit, naming the numbers and the fixes. The numbers follow what the trainer and
the rollout engines do here (services/trainer/worker.py, fsdp.py; services/explorer/engines/):

Trainer, per rank (N = trainer.nproc ranks, FSDP2 shards everything N ways; CUDA, bf16 compute):
    parameters   4 B x (P + T') / N   fp32 master weights (P: every parameter of the policy; T':
                                      the LoRA adapter's, 0 without LoRA)
    gradients    4 B x T / N          fp32 (T: trainable parameters; P, or the LoRA adapter's)
                 + 4 B x T            several ranks deferring the sync (trainer.defer_grad_sync, or
                                      LoRA): unsharded fp32 gradients until a step's last micro-batch
    optimizer    8 B x T / N          AdamW exp_avg + exp_avg_sq, fp32
    gathered     2 B x P              one rank: FSDP2 keeps every unsharded bf16 parameter
                 2 B x (R + 2 x Lp)   several ranks (or param offload): the root's (R: embeddings,
                                      lm_head, final norm), one decoder layer (Lp) and the prefetched
                                      next one, in bf16
    reference    2 B x P / N          bf16, only when a KL term or the loss (DPO) reads it and no
                                      LoRA (with LoRA the reference is the policy, adapters off)
    critic       16 B x Pc / N        PPO's value model: weights, gradients and AdamW, fp32, plus
                                      its gathered bf16 copy as above
    activations  tokens x L x A                     without gradient checkpointing
                 tokens x (L x 2h + A)              with it: each decoder layer keeps only its bf16
                                                    input; one layer is recomputed at a time
                 A = 2 B x (12h + 2 kv + 4i): a decoder layer's saved tensors per token (bf16 norms'
                 inputs and outputs with their fp32 upcast, q, k, v, attention output, the SwiGLU
                 gate, up, product and down input; flash attention keeps no s x s scores).
                 Measured on a real bf16 Qwen2 with the trainer's checkpointing switch
                 (tests/unit/launch/test_memory_plan.py): 2h per layer checkpointed, about A - 4h without;
                 the final norm's tensors (~9h per token, once) fall within that margin.
                 tokens: the token budget of a micro-batch (use_dynamic_bsz) or
                 micro_batch_size_per_gpu x max_model_len (x 2 rows for DPO pairs).
    logits       C x 20 B x V                       the LM head's peak (`logits_bytes`): fp32
                                                    log-softmax backward, derived there; C tokens:
                                                    one chunk (trainer.logits_chunk_tokens; the
                                                    backward recomputes a chunk's logits), or every
                                                    token with chunking off (0)
    weight-sync snapshot  2 B x P                   rank 0, sync_method nccl on CUDA: the whole policy
                 gathered in bf16 on the GPU (trainer/weight_sync.py, FULL_ON_DEVICE) while it is
                 broadcast; with sync_offset >= 1 it is held while the next step trains, with 0
                 it counts only beyond the activations (taken between steps)
    weight-sync buckets   2 x bucket_bytes          rank 0, nccl on CUDA: the double-buffered bucket
                                                    buffers, kept for the group's lifetime
    margin       MARGIN_GIB per process: CUDA context, NCCL buffers, allocator fragmentation.
Rollout engine, per engine (tp = tensor_parallel_size GPUs):
    hf           2 B x P weights (bf16) + KV cache: micro_batch_size x max_model_len x L x 2 x kv
                 x 2 B, + its logits (micro_batch_size x V x 4 B); on one GPU (tp 1)
    vllm         gpu_memory_utilization x capacity on each of its GPUs (vLLM reserves it)
    weight-sync receive   2 B x P + 2 x bucket_bytes  each engine GPU, nccl on CUDA: the received
                 bf16 copy being loaded (transient, outside vLLM's reserve) and the bucket buffers
veRL's offload keys in `trainer.trainer_config`: `actor.fsdp_config.param_offload` puts parameters,
gradients and the optimizer on the CPU (only the gathered layers stay); `optimizer_offload` brings the
optimizer state to the device only for the step, when activations are freed (it counts only beyond
them); `ref.fsdp_config.param_offload` keeps the reference on the CPU.
On a shared GPU (one-GPU mode, gpus.py) both sum on GPU 0.
Colocated (`cluster.colocate`, gpus.py `place_colocated`): each GPU gets a plan per phase, and each
phase must fit: `rollout` = the engine's bytes + what the trainer keeps resident between steps (its
fp32 parameters, the reference, the critic, the optimizer state unless `optimizer_offload`, its
margin); `train` = the trainer's step + what the sleeping engine leaves (its CUDA context: vLLM's
sleep level 1 moves the weights to host memory and drops the KV cache, the hf engine moves its
weights off the device).
Capacity: `cluster.gpu_memory_gib`, or the device's own size when `rft run` sees CUDA.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.config.compat import flatten
from services.common.config.gpus import GpuPlacement, gpu_demand, place_gpus
from services.common.config.resolved import resolve
from services.common.config.root import RFTConfig

GIB = 1 << 30
MARGIN_GIB = 2.0
DEFAULT_TOKEN_BUDGET = 16384  # the trainer's budget when nothing sets one (services/trainer/settings.py)
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GRADIENT_CHECKPOINTING_KEY = "actor_rollout_ref.model.enable_gradient_checkpointing"
PARAM_OFFLOAD_KEY = "actor_rollout_ref.actor.fsdp_config.param_offload"
OPTIMIZER_OFFLOAD_KEY = "actor_rollout_ref.actor.fsdp_config.optimizer_offload"
# Peak bytes per kept token per vocabulary entry of the LM head and the log-probs (`logits_bytes`).
LOGITS_BYTES_PER_TOKEN_VOCAB = 20
REF_PARAM_OFFLOAD_KEY = "actor_rollout_ref.ref.fsdp_config.param_offload"
# presets (services/trainer/algorithms/presets.py) with no reference model or with no KL loss
_NO_REFERENCE = ("dapo", "sft")
_NO_KL_LOSS = ("gpg", "dapo", "sft")


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a decoder-only HF model (Llama / Qwen2 family `config.json`)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    bias: bool  # q/k/v projections carry a bias (Qwen2)

    @classmethod
    def from_json(cls, cfg: dict[str, Any]) -> ModelShape:
        cfg = cfg.get("text_config", cfg)
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            hidden=hidden,
            intermediate=int(cfg["intermediate_size"]),
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        )

    @property
    def kv(self) -> int:
        """Width of k (and of v): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h, q = self.hidden, self.heads * self.head_dim
        attn = h * q + 2 * h * self.kv + q * h + (q + 2 * self.kv if self.bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers: embeddings, lm_head (unless tied), final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def lora_params(self, rank: int, targets: str | list[str]) -> int:
        """Adapter parameters: rank x (in + out) per targeted linear of every layer."""
        h, q, i, kv = self.hidden, self.heads * self.head_dim, self.intermediate, self.kv
        shapes = {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }  # fmt: skip
        names = (
            LORA_MODULES
            if targets == "all-linear"
            else [t for t in ([targets] if isinstance(targets, str) else targets) if t in shapes]
        )
        return self.layers * sum(rank * sum(shapes[n]) for n in names)

    @property
    def activation_bytes_per_token_layer(self) -> int:
        return 2 * (12 * self.hidden + 2 * self.kv + 4 * self.intermediate)


def read_shape(model_path: str) -> tuple[ModelShape | None, str]:
    """The shape from `<model_path>/config.json`; (None, why) when there is no local folder or file."""
    if not model_path:
        return None, "model.model_path is not set: no memory plan"
    file = Path(model_path).expanduser() / "config.json"
    if not file.is_file():
        return None, f"{model_path!r} has no local config.json (models are never downloaded): no memory plan"
    try:
        return ModelShape.from_json(json.loads(file.read_text())), ""
    except (ValueError, KeyError, TypeError) as exc:
        return (
            None,
            f"{file}: not a decoder config this plan reads ({type(exc).__name__}: {exc}): no memory plan",
        )


@dataclass(frozen=True)
class TrainerPlan:
    """Bytes per trainer rank, by component (zero components are left out of the table)."""

    parts: dict[str, float]
    tokens: int  # tokens of one micro-batch

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def uses_reference(config: RFTConfig) -> bool:
    """The trainer's `use_reference` (services/trainer/settings.py), from the config alone."""
    a = config.algorithm
    if (a.policy_loss_fn or a.algorithm_type) == "dpo":
        return True
    if a.algorithm_type in _NO_REFERENCE:
        return False
    kl_loss = a.kl_loss_fn or ("none" if a.algorithm_type in _NO_KL_LOSS else "k2")
    return kl_loss != "none" or (a.kl_penalty_fn or "none") != "none"


def uses_critic(config: RFTConfig) -> bool:
    return config.algorithm.algorithm_type == "ppo"


def _extra(config: RFTConfig) -> dict[str, Any]:
    """`trainer.trainer_config` flattened to veRL's dotted keys."""
    return flatten(config.trainer.trainer_config)


def gradient_checkpointing(config: RFTConfig) -> bool:
    return bool(_extra(config).get(GRADIENT_CHECKPOINTING_KEY, False))


def micro_batch_tokens(config: RFTConfig) -> int:
    """Tokens of one trainer micro-batch: the dynamic token budget, or rows x max_model_len."""
    r = resolve(config)
    t = config.trainer
    extra = _extra(config)
    dynamic = bool(extra.get("actor_rollout_ref.actor.use_dynamic_bsz", t.use_dynamic_bsz))
    budget = int(
        extra.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
        or r.max_token_len_per_gpu
        or DEFAULT_TOKEN_BUDGET
    )
    if dynamic or not r.max_model_len:
        return budget
    rows = int(extra.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", t.micro_batch_size_per_gpu))
    return rows * (2 if config.algorithm.pairwise else 1) * r.max_model_len


def logit_tokens(config: RFTConfig, tokens: int) -> int:
    """Tokens whose logits exist at once: one chunk (`trainer.logits_chunk_tokens`), or all of them
    with chunking off (0)."""
    chunk = config.trainer.logits_chunk_tokens
    return min(tokens, chunk) if chunk > 0 else tokens


def unsynced_grads(config: RFTConfig, trainable: int) -> float:
    """Several ranks deferring the gradient sync (`trainer.defer_grad_sync`: set, or unset with LoRA):
    the full unsharded fp32 gradients each rank accumulates on the device (also with param offload)
    until the last micro-batch of a step reduce-scatters them."""
    t = config.trainer
    defer = t.defer_grad_sync if t.defer_grad_sync is not None else bool(config.model.lora_configs)
    return 4.0 * trainable if t.nproc * t.nnodes > 1 and defer else 0.0


def _gathered(shape: ModelShape, ranks: int) -> float:
    if ranks == 1:
        return 2.0 * shape.params
    return 2.0 * (shape.root_params + 2 * shape.layer_params)


def trainer_plan(
    config: RFTConfig, shape: ModelShape, critic: ModelShape | None = None, rank0: bool = True
) -> TrainerPlan:
    """Bytes per trainer rank by component (see the module docstring for each formula); `rank0`:
    with the weight-sync sender's memory (rank 0 broadcasts)."""
    n = config.trainer.nproc
    extra = _extra(config)
    p = shape.params
    lora = config.model.lora_configs[0] if config.model.lora_configs else None
    trainable = shape.lora_params(lora.lora_rank, lora.target_modules) if lora else p
    tokens = micro_batch_tokens(config)
    a = shape.activation_bytes_per_token_layer
    if gradient_checkpointing(config):
        per_token = shape.layers * 2 * shape.hidden + a
    else:
        per_token = shape.layers * a
    layers = float(tokens * per_token)
    logits = logits_bytes(config, shape, tokens)
    on_cpu = bool(extra.get(PARAM_OFFLOAD_KEY, False))
    gathered = _gathered(shape, 2 if on_cpu else n)  # offload reshards after forward, as several ranks
    optimizer = 0.0 if on_cpu else 8.0 * trainable / n
    if optimizer and extra.get(OPTIMIZER_OFFLOAD_KEY, False):
        # back on the device for the step only, when the activations and gathered layers are freed
        optimizer = max(0.0, optimizer - layers - logits - gathered)
    reference = uses_reference(config) and lora is None and not extra.get(REF_PARAM_OFFLOAD_KEY, False)
    parts = {
        "parameters (fp32)": 0.0 if on_cpu else 4.0 * (p + (trainable if lora else 0)) / n,
        "gradients (fp32)": (0.0 if on_cpu else 4.0 * trainable / n) + unsynced_grads(config, trainable),
        "optimizer (AdamW fp32)": optimizer,
        "gathered bf16": gathered,
        "reference (bf16)": 2.0 * p / n if reference else 0.0,
        "critic": 0.0,
        "activations": layers,
        "logits (LM head)": logits,
        "margin": MARGIN_GIB * GIB,
    }
    if uses_critic(config):
        c = critic or shape
        parts["critic"] = 16.0 * c.params / n + _gathered(c, n)
    if rank0:
        parts.update(sender_sync_bytes(config, shape, layers + logits))
    parts["margin"] = parts.pop("margin")  # the last row
    return TrainerPlan({k: v for k, v in parts.items() if v}, tokens)


def logits_bytes(config: RFTConfig, shape: ModelShape, tokens: int) -> float:
    """Peak bytes of the LM head and the log-probs over `tokens` tokens of one micro-batch.

    Per token, in units of V (services/trainer/actor.py `policy_forward`, algorithms/entropy.py;
    measured with a live-tensor tracker in tests/unit/launch/test_memory_plan.py):
      forward:  2 (bf16 logits, held by the model output) + 4 (their fp32 copy, saved by logsumexp)
                + 4 + 4 (the no-grad entropy's exp(z - lse) and its product with z)      = 14
      backward: 4 (the saved fp32 logits) + 4 (gather's gradient) + 4 + 4 + 4 (logsumexp's
                z - lse, its exp, the product with the incoming gradient)                = 20
    The backward peak comes first in the backward pass, while every layer's activations are still
    held, so it adds to them whole. With the head in chunks (`trainer.logits_chunk_tokens`,
    services/trainer/chunked_logprobs.py) only one chunk's logits are live at a time, in the forward
    and in the backward (which recomputes them); with chunking off every token counts (a padded
    micro-batch computes the head at every position, a packed one only at the response positions:
    the plan stays an upper bound).
    """
    return float(logit_tokens(config, tokens) * LOGITS_BYTES_PER_TOKEN_VOCAB * shape.vocab)


def broadcasts_from_gpu(config: RFTConfig) -> bool:
    """The nccl sync method with an NCCL group (trainer/weight_sync.py `broadcasts_on_device`): the
    trainer gathers the policy on its GPU and the engines receive it on theirs. gloo (set, or on a
    shared GPU) goes through host memory."""
    from services.weight_sync.method import sync_method  # torch: only when a plan is made

    return (
        sync_method(config.synchronizer.sync_method).broadcast
        and resolve(config).weight_sync_backend != "gloo"
    )


def sender_sync_bytes(config: RFTConfig, shape: ModelShape, activations: float) -> dict[str, float]:
    """Trainer rank 0's weight-sync memory (module docstring): the bf16 snapshot of the whole policy,
    held through the next step when the sync is pipelined (sync_offset >= 1), and the bucket buffers."""
    if not broadcasts_from_gpu(config):
        return {}
    snapshot = 2.0 * shape.params
    if config.synchronizer.sync_offset < 1:  # gathered and sent between steps, activations freed
        snapshot = max(0.0, snapshot - activations)
    return {
        "weight-sync snapshot (bf16)": snapshot,
        "weight-sync buckets": 2.0 * config.synchronizer.bucket_bytes,
    }


def receiver_sync_bytes(config: RFTConfig, shape: ModelShape) -> dict[str, float]:
    """One engine GPU's weight-sync memory: the received bf16 copy being loaded, and the buckets."""
    if not broadcasts_from_gpu(config):
        return {}
    return {"rollout weight-sync receive (bf16)": 2.0 * shape.params + 2.0 * config.synchronizer.bucket_bytes}


def hf_engine_bytes(config: RFTConfig, shape: ModelShape) -> dict[str, float]:
    """One hf rollout engine on one GPU: bf16 weights, the KV cache of a generation batch, logits."""
    r = resolve(config)
    rollout = config.explorer.rollout_model
    batch = rollout.micro_batch_size
    length = r.max_model_len or 0
    return {
        "rollout weights (bf16)": 2.0 * shape.params,
        "rollout KV cache": float(batch * length * shape.layers * 2 * shape.kv * 2 + batch * shape.vocab * 4),
        "margin (rollout)": MARGIN_GIB * GIB,
    }


@dataclass
class MemoryPlan:
    """Bytes per GPU of the placement ("GPU 0", ...; without a placement "trainer rank" and "rollout
    engine"), by component; `problems()` lists what does not fit, with the fixes."""

    capacity_bytes: float
    columns: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    placed: bool = True
    shared: bool = False
    rollout_cap_bytes: float | None = None  # hf engine's CUDA allocator cap (gpu_memory_utilization)
    # on a shared GPU: the trainer's allocator cap (resolved.py trainer_gpu_memory_fraction) and what it
    # allocates there (its parts less its margin, which is outside the allocator)
    trainer_cap_bytes: float | None = None
    trainer_need_bytes: float = 0.0
    capacity_from: str = "cluster.gpu_memory_gib"

    def total(self, column: str) -> float:
        return sum(self.columns[column].values())

    def problems(self) -> list[str]:
        """One line per GPU over capacity (and an hf engine over its own cap, and a trainer over its own
        on a shared GPU that fits), with the fixes."""
        out = []
        cap = self.capacity_bytes
        for name, parts in self.columns.items():
            total = sum(parts.values())
            if not self.placed or total <= cap:
                continue
            largest = sorted(parts.items(), key=lambda kv: -kv[1])[:4]
            who = "the trainer and the rollout engine" if self.shared else "its processes"
            if name.endswith((" rollout", " train")):
                who = f"in the {name.rsplit(' ', 1)[1]} phase, the trainer and the rollout engine"
                name = name.rsplit(" ", 1)[0]
            out.append(
                f"{name}: {who} need about {total / GIB:.1f} GiB but it has {cap / GIB:.1f} GiB "
                f"({self.capacity_from}; largest: {', '.join(f'{k} {v / GIB:.1f}' for k, v in largest)} GiB)"
                + (f"; fixes: {'; '.join(self.fixes)}" if self.fixes else "")
            )
        if self.rollout_cap_bytes is not None:
            need = max(
                (
                    sum(v for k, v in parts.items() if k.startswith("rollout"))
                    for parts in self.columns.values()
                ),
                default=0.0,
            )
            if need > self.rollout_cap_bytes:
                out.append(
                    f"the hf rollout engine needs about {need / GIB:.1f} GiB but its share of the GPU is "
                    f"{self.rollout_cap_bytes / GIB:.1f} GiB (explorer.rollout_model.gpu_memory_utilization); "
                    "raise it, or lower explorer.rollout_model.micro_batch_size or model.max_model_len"
                )
        over = bool(out)  # a GPU over capacity already names the trainer's fixes
        if (
            not over
            and self.trainer_cap_bytes is not None
            and self.trainer_need_bytes > self.trainer_cap_bytes
        ):
            out.append(
                f"the trainer needs about {self.trainer_need_bytes / GIB:.1f} GiB but caps itself at "
                f"{self.trainer_cap_bytes / GIB:.1f} GiB on the GPU it shares (1 - "
                "explorer.rollout_model.gpu_memory_utilization - 0.05); lower that share"
                + (f", or use {'; '.join(self.fixes)}" if self.fixes else "")
            )
        return out

    def table(self) -> str:
        """GiB per component (rows) per GPU (columns), then the notes."""
        if not self.columns:
            return "\n".join(self.notes)
        cols = list(self.columns)
        names = list(dict.fromkeys(k for parts in self.columns.values() for k in parts))
        width = max(len(n) for n in [*names, "capacity"])
        cw = max(9, *(len(c) for c in cols))

        def row(label: str, cells: list[float | None]) -> str:
            text = ("" if c is None else f"{c / GIB:.1f}" for c in cells)
            return f"{label:<{width}}  " + "  ".join(f"{t:>{cw}}" for t in text)

        lines = [f"{'GiB':<{width}}  " + "  ".join(f"{c:>{cw}}" for c in cols)]
        lines += [row(n, [self.columns[c].get(n) for c in cols]) for n in names]
        lines.append(row("total", [self.total(c) for c in cols]))
        if self.placed:
            lines.append(row("capacity", [self.capacity_bytes] * len(cols)))
        return "\n".join(lines + self.notes)


def _fixes(config: RFTConfig) -> list[str]:
    fixes = []
    if not gradient_checkpointing(config):
        fixes.append(f"gradient checkpointing (trainer.trainer_config {GRADIENT_CHECKPOINTING_KEY}: true)")
    fixes.append("a smaller micro-batch (trainer.max_token_len_per_gpu, or micro_batch_size_per_gpu)")
    fixes.append("more trainer GPUs (cluster.gpu_per_node and trainer.nproc)")
    extra = _extra(config)
    if not (extra.get(PARAM_OFFLOAD_KEY) and extra.get(OPTIMIZER_OFFLOAD_KEY)):
        fixes.append(f"offload (trainer.trainer_config {PARAM_OFFLOAD_KEY} / {OPTIMIZER_OFFLOAD_KEY}: true)")
    if not config.model.lora_configs:
        fixes.append("LoRA (model.lora_configs)")
    return fixes


def memory_plan(
    config: RFTConfig,
    capacity_gib: float | None = None,
    placement: GpuPlacement | None = None,
) -> MemoryPlan:
    """The plan for `config` (one explorer unless `placement` is given); `capacity_gib` replaces
    `cluster.gpu_memory_gib` (the device's own size, where `rft run` sees CUDA)."""
    cap = (capacity_gib or config.cluster.gpu_memory_gib) * GIB
    c = config.cluster
    if placement is None:
        placement = place_gpus(
            c.node_num * c.gpu_per_node, gpu_demand(config), mode=config.mode, colocate=c.colocate
        )
    plan = MemoryPlan(cap, placed=placement.total > 0, shared=placement.shared, fixes=_fixes(config))
    if capacity_gib:
        plan.capacity_from = "the device's own size"
    shape, why = read_shape(config.model.model_path)
    if shape is None:
        plan.notes.append(why)
        return plan
    critic = None
    if uses_critic(config) and config.model.critic_model_path:
        critic, why = read_shape(config.model.critic_model_path)
        if critic is None:
            plan.notes.append(f"critic: {why}; planned at the policy's size")
    rollout = config.explorer.rollout_model
    rollout_shape = shape
    if rollout.model_path and rollout.model_path != config.model.model_path:
        rollout_shape = read_shape(rollout.model_path)[0] or shape
    has_trainer = config.mode in ("both", "train", "serve")
    has_explorer = config.mode != "train"
    trainer = trainer_plan(config, shape, critic).parts if has_trainer else {}  # rank 0 (the sender)
    other_ranks = trainer_plan(config, shape, critic, rank0=False).parts if has_trainer else {}
    fraction = resolve(config).rollout_gpu_memory_utilization
    if placement.colocated and plan.placed:
        _colocated_columns(
            plan, placement, config, trainer, other_ranks, rollout, rollout_shape, fraction, cap
        )
        if rollout.engine_type == "hf" and fraction is not None:
            plan.rollout_cap_bytes = fraction * cap
        return plan
    if not plan.placed:  # gpu_per_node 0: what one trainer rank and one engine need, no GPU check
        engine = _engine_gpus(rollout, rollout_shape, config, fraction, cap)[0] if has_explorer else {}
        plan.columns = {k: v for k, v in (("trainer rank", trainer), ("rollout engine", engine)) if v}
        plan.notes.append("cluster.gpu_per_node is 0: no GPUs placed, nothing is checked against a capacity")
        return plan
    gpus: dict[int, dict[str, float]] = {}
    for rank, g in enumerate(placement.trainer[: placement.trainer_ranks]):
        gpus.setdefault(g, {}).update(other_ranks if rank else trainer)
    tp = rollout.tensor_parallel_size
    for block in placement.explorers:
        for i in range(rollout.engine_num):
            for k, parts in enumerate(_engine_gpus(rollout, rollout_shape, config, fraction, cap)):
                gpus.setdefault(block[i * tp + k], {}).update(parts)
    plan.columns = {f"GPU {g}": gpus[g] for g in sorted(gpus)}
    if rollout.engine_type == "hf" and fraction is not None and has_explorer:
        plan.rollout_cap_bytes = fraction * cap
    trainer_fraction = resolve(config).trainer_gpu_memory_fraction
    if placement.shared and has_trainer and trainer_fraction is not None:
        plan.trainer_cap_bytes = trainer_fraction * cap
        plan.trainer_need_bytes = sum(v for k, v in trainer.items() if k != "margin")
    if any(m.model_path and not m.api_base for m in config.explorer.auxiliary_models):
        plan.notes.append("auxiliary models on the explorer's GPUs are not planned")
    return plan


# What the trainer keeps on its GPU between steps (the rollout phase of a colocated GPU).
_RESIDENT = ("parameters (fp32)", "reference (bf16)", "critic", "optimizer (AdamW fp32)", "margin")
ASLEEP = "rollout asleep (CUDA context)"


def _colocated_columns(
    plan: MemoryPlan,
    placement: GpuPlacement,
    config: RFTConfig,
    rank0: dict[str, float],
    ranks: dict[str, float],
    rollout: Any,
    shape: ModelShape,
    fraction: float | None,
    cap: float,
) -> None:
    """Two columns per GPU, `GPU g rollout` and `GPU g train` (module docstring)."""
    offloaded = bool(_extra(config).get(OPTIMIZER_OFFLOAD_KEY, False))
    engines: dict[int, dict[str, float]] = {}
    tp = rollout.tensor_parallel_size
    for block in placement.explorers:
        for i in range(rollout.engine_num):
            for k, parts in enumerate(_engine_gpus(rollout, shape, config, fraction, cap)):
                engines.setdefault(block[i * tp + k], {}).update(parts)
    trainers = {
        g: (ranks if r else rank0) for r, g in enumerate(placement.trainer[: placement.trainer_ranks])
    }
    for g in sorted(set(engines) | set(trainers)):
        step = trainers.get(g, {})
        resident = {
            f"{k} (resident)": v
            for k, v in step.items()
            if k in _RESIDENT and not (offloaded and k.startswith("optimizer"))
        }
        plan.columns[f"GPU {g} rollout"] = {**engines.get(g, {}), **resident}
        plan.columns[f"GPU {g} train"] = {**step, **({ASLEEP: MARGIN_GIB * GIB} if g in engines else {})}
    plan.notes.append(
        "cluster.colocate: each GPU is planned per phase (rollout: the engines awake and the trainer's "
        "resident state; train: the trainer's step and the sleeping engines); the larger must fit"
    )


def _engine_gpus(
    rollout: Any, shape: ModelShape, config: RFTConfig, fraction: float | None, cap: float
) -> list[dict[str, float]]:
    """One rollout engine's bytes on each of its GPUs (vLLM: its reserve on each of its tp GPUs; hf:
    everything on its first GPU)."""
    received = receiver_sync_bytes(config, shape)
    if rollout.engine_type == "vllm":
        reserve = (fraction or rollout.gpu_memory_utilization) * cap
        return [{"rollout (vLLM reserve)": reserve, **received} for _ in range(rollout.tensor_parallel_size)]
    if rollout.engine_type == "hf":
        return [{**hf_engine_bytes(config, shape), **received}]
    return [{}]
