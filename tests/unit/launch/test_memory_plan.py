"""The memory plan's formulas pinned against hand-computed numbers, on config.json files shaped as
Qwen2.5-0.5B, 1.5B and 7B (written here; no weights, no download, no GPU): parameter counts, each
trainer and rollout component, a 7B full fine-tune refused on one 80 GiB GPU and accepted with LoRA
(and gradient checkpointing) or with 8 trainer ranks; `rft config show` prints the plan and `rft config
check` refuses the misfit with exit code 2, naming the numbers and the fixes. The logits and activation
terms are checked against the bytes the real code keeps (a live-tensor tracker on CPU), the nccl
weight-sync terms by method, and examples/gsm8k_grpo.yaml must fit 80 GiB GPUs with headroom."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from typer.testing import CliRunner

from launcher.cli import app
from launcher.memory_plan import (
    GIB,
    LOGITS_BYTES_PER_TOKEN_VOCAB,
    ModelShape,
    hf_engine_bytes,
    logits_bytes,
    memory_plan,
    read_shape,
    trainer_plan,
    uses_critic,
    uses_reference,
)
from services.common.config import load_config
from services.trainer.algorithms import logprobs_and_entropy

QWEN_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
QWEN_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
# hand-computed: per layer q 896*896+896, k and v 896*128+128 each, o 896*896, MLP 3*896*4864, norms 2*896
P_05B = 24 * (803_712 + 2 * 114_816 + 802_816 + 13_074_432 + 1_792) + 151_936 * 896 + 896
# per layer q 3584^2+3584, k and v 3584*512+512 each, o 3584^2, MLP 3*3584*18944, norms 2*3584; untied head
P_7B = 28 * (12_848_640 + 2 * 1_835_520 + 12_845_056 + 203_685_888 + 7_168) + 2 * 152_064 * 3_584 + 3_584
MARGIN = 2 * GIB
ROOT = Path(__file__).resolve().parents[3]
RUN = "algorithm: {{algorithm_type: grpo}}\nmodel: {{model_path: {path}, max_prompt_tokens: 256, max_response_tokens: 768}}\n"


def _model(tmp_path: Path, name: str, cfg: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _config(path: Path, extra: str = ""):
    return load_config(text=RUN.format(path=path) + extra, environ={})


def test_parameter_counts_are_the_published_sizes():
    assert P_05B == 494_032_768 and P_7B == 7_615_616_512  # Qwen2.5-0.5B, Qwen2.5-7B
    assert ModelShape.from_json(QWEN_05B).params == P_05B
    assert ModelShape.from_json(QWEN_7B).params == P_7B
    # LoRA rank 32 on all seven linears: 32 x (in + out) each, per layer
    per_layer = 32 * ((3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 3)
    assert ModelShape.from_json(QWEN_7B).lora_params(32, "all-linear") == 28 * per_layer == 80_740_352
    assert ModelShape.from_json(QWEN_7B).lora_params(8, ["q_proj", "v_proj"]) == 28 * 8 * (7168 + 4096)


def test_qwen_05b_trainer_and_hf_engine_on_one_shared_gpu(tmp_path):
    config = _config(_model(tmp_path, "q05", QWEN_05B), "cluster: {gpu_per_node: 1}\n")
    shape = ModelShape.from_json(QWEN_05B)
    trainer = trainer_plan(config, shape)
    # max_model_len 256 + 768 = 1024; dynamic batches of 2 x 1024 tokens (Trinity-RFT's default)
    assert trainer.tokens == 2048
    # per token: 24 layers x 2 B x (12 x 896 + 2 x 128 + 4 x 4864), and 20 B x 151936 for the logits
    per_token = 24 * 2 * (12 * 896 + 2 * 128 + 4 * 4864)
    assert per_token == 1_462_272
    assert trainer.parts == {
        "parameters (fp32)": 4 * P_05B,
        "gradients (fp32)": 4 * P_05B,
        "optimizer (AdamW fp32)": 8 * P_05B,
        "gathered bf16": 2 * P_05B,  # one rank keeps every unsharded bf16 parameter
        "reference (bf16)": 2 * P_05B,  # GRPO's default k2 KL loss reads the reference
        "activations": 2048 * 1_462_272,
        "logits (LM head)": 2048 * 20 * 151_936,
        "margin": MARGIN,
    }  # no weight-sync snapshot: on a shared GPU the nccl method goes through a gloo group
    engine = hf_engine_bytes(config, shape)
    # KV: 64 sequences x 1024 tokens x 24 layers x (k, v) x 128 x 2 B; logits 64 x 151936 x 4 B
    assert engine == {
        "rollout weights (bf16)": 2 * P_05B,
        "rollout KV cache": 64 * 1024 * 24 * 2 * 128 * 2 + 64 * 151_936 * 4,
        "margin (rollout)": MARGIN,
    }
    plan = memory_plan(config)
    assert plan.shared and list(plan.columns) == ["GPU 0"]
    assert plan.total("GPU 0") == pytest.approx(trainer.total + sum(engine.values()))
    kv = 64 * 1024 * 24 * 2 * 128 * 2 + 64 * 151_936 * 4
    act = 2048 * (1_462_272 + 20 * 151_936)
    assert plan.total("GPU 0") == 20 * P_05B + act + 2 * P_05B + kv + 2 * MARGIN
    assert plan.total("GPU 0") / GIB == pytest.approx(23.5, abs=0.05)
    assert plan.problems() == []
    assert plan.rollout_cap_bytes == 0.3 * 80 * GIB
    assert plan.trainer_cap_bytes == pytest.approx(0.65 * 80 * GIB)  # 1 - 0.3 - the 0.05 margin
    assert plan.trainer_need_bytes == trainer.total - MARGIN  # the margin is outside the allocator


def test_gradient_checkpointing_keeps_one_layer_and_the_layer_inputs(tmp_path):
    config = _config(
        _model(tmp_path, "q05", QWEN_05B),
        "trainer: {trainer_config: {actor_rollout_ref: {model: {enable_gradient_checkpointing: true}}}}\n",
    )
    a = 2 * (12 * 896 + 2 * 128 + 4 * 4864)
    parts = trainer_plan(config, ModelShape.from_json(QWEN_05B)).parts
    assert parts["activations"] == 2048 * (24 * 2 * 896 + a)
    assert parts["logits (LM head)"] == 2048 * 20 * 151_936  # the head is not checkpointed


def test_fixed_micro_batches_use_rows_times_the_length(tmp_path):
    config = _config(
        _model(tmp_path, "q05", QWEN_05B), "trainer: {use_dynamic_bsz: false, micro_batch_size_per_gpu: 4}\n"
    )
    assert trainer_plan(config, ModelShape.from_json(QWEN_05B)).tokens == 4 * 1024


def test_the_trainer_side_flags_match_the_trainer_settings(tmp_path):
    from services.trainer.settings import TrainerSettings

    model = _model(tmp_path, "q05", QWEN_05B)
    for algorithm in ("ppo", "grpo", "dapo", "sft", "gpg", "dpo", "rloo"):
        for kl in ("", ", kl_loss_fn: none", ", kl_loss_fn: none, kl_penalty_fn: k1"):
            text = f"algorithm: {{algorithm_type: {algorithm}{kl}}}\nmodel: {{model_path: {model}, max_response_tokens: 8}}\n"
            config = load_config(text=text, environ={})
            settings = TrainerSettings.from_config(config)
            assert uses_reference(config) == settings.use_reference, (algorithm, kl)
            assert uses_critic(config) == settings.use_critic, algorithm


def test_several_ranks_shard_everything_and_gather_one_layer_at_a_time(tmp_path):
    config = _config(
        _model(tmp_path, "q7", QWEN_7B), "mode: train\ncluster: {gpu_per_node: 8}\ntrainer: {nproc: 8}\n"
    )
    shape = ModelShape.from_json(QWEN_7B)
    parts = trainer_plan(config, shape).parts
    assert parts["parameters (fp32)"] == 4 * P_7B / 8 and parts["optimizer (AdamW fp32)"] == 8 * P_7B / 8
    # the root (embeddings + lm_head + final norm) and two decoder layers (current + prefetched), bf16
    assert parts["gathered bf16"] == 2 * (2 * 152_064 * 3_584 + 3_584 + 2 * shape.layer_params)
    assert shape.layer_params == 233_057_792


def test_offload_moves_parameters_gradients_and_the_optimizer_off_the_gpu(tmp_path):
    model = _model(tmp_path, "q05", QWEN_05B)
    offload = "trainer: {trainer_config: {actor_rollout_ref: {actor: {fsdp_config: {%s: true}}}}}\n"
    parts = trainer_plan(_config(model, offload % "param_offload"), ModelShape.from_json(QWEN_05B)).parts
    assert "parameters (fp32)" not in parts and "optimizer (AdamW fp32)" not in parts
    assert parts["gathered bf16"] == 2 * (151_936 * 896 + 896 + 2 * 14_912_384)
    # optimizer state comes back for the step only, when activations (9.2 GB) are freed: 8P = 3.95 GB fits
    opt = trainer_plan(_config(model, offload % "optimizer_offload"), ModelShape.from_json(QWEN_05B)).parts
    assert "optimizer (AdamW fp32)" not in opt and opt["parameters (fp32)"] == 4 * P_05B


def test_a_7b_full_fine_tune_does_not_fit_one_80_gib_gpu(tmp_path):
    config = _config(_model(tmp_path, "q7", QWEN_7B), "cluster: {gpu_per_node: 1}\n")
    plan = memory_plan(config)
    (problem,) = plan.problems()
    assert problem.startswith("GPU 0: the trainer and the rollout engine need about ")
    assert "but it has 80.0 GiB" in problem and "optimizer (AdamW fp32) 56.7" in problem  # 8 x P_7B
    for fix in ("gradient checkpointing", "smaller micro-batch", "more trainer GPUs", "offload", "LoRA"):
        assert fix in problem
    assert plan.total("GPU 0") / GIB > 150


def test_the_7b_fits_with_lora_and_checkpointing_or_with_8_ranks(tmp_path):
    model = _model(tmp_path, "q7", QWEN_7B)
    # the one-GPU config of the refused test, with a rank-32 LoRA adapter and gradient checkpointing
    config = load_config(
        text=RUN.format(path=model).replace("768}", "768, lora_configs: [{lora_rank: 32}]}")
        + "cluster: {gpu_per_node: 1}\n"
        + "trainer: {trainer_config: {actor_rollout_ref: {model: {enable_gradient_checkpointing: true}}}}\n",
        environ={},
    )
    assert config.model.lora_configs[0].lora_rank == 32
    plan = memory_plan(config)
    parts = plan.columns["GPU 0"]
    t = 80_740_352
    assert parts["parameters (fp32)"] == 4 * (P_7B + t) and parts["optimizer (AdamW fp32)"] == 8 * t
    assert "reference (bf16)" not in parts  # with LoRA the reference is the policy, adapters off
    assert plan.problems() == [] and plan.total("GPU 0") / GIB == pytest.approx(72.1, abs=0.1)
    # a larger engine share leaves the trainer's allocator too little though the GPU's total fits
    greedy = load_config(
        text=RUN.format(path=model).replace("768}", "768, lora_configs: [{lora_rank: 32}]}")
        + "cluster: {gpu_per_node: 1}\nexplorer: {rollout_model: {gpu_memory_utilization: 0.4}}\n"
        + "trainer: {trainer_config: {actor_rollout_ref: {model: {enable_gradient_checkpointing: true}}}}\n",
        environ={},
    )
    (problem,) = memory_plan(greedy).problems()
    assert problem.startswith("the trainer needs about 50.4 GiB but caps itself at 44.0 GiB"), problem
    eight = memory_plan(_config(model, "cluster: {node_num: 2, gpu_per_node: 8}\ntrainer: {nproc: 8}\n"))
    assert list(eight.columns) == [f"GPU {g}" for g in range(9)]  # explorer on 0, 8 trainer ranks
    assert eight.problems() == []
    # 16 B x P / 8 (fp32 weights, grads, AdamW), gathered root + 2 layers, bf16 reference / 8, 2048 tokens
    gathered = 2 * (2 * 152_064 * 3_584 + 3_584 + 2 * 233_057_792)
    act = 2048 * (28 * 2 * (12 * 3584 + 2 * 512 + 4 * 18944) + 20 * 152_064)
    assert eight.total("GPU 2") == 2 * P_7B + gathered + P_7B / 4 + act + MARGIN
    assert eight.total("GPU 2") / GIB == pytest.approx(39.5, abs=0.05)
    # rank 0 (GPU 1) sends the weights: sync_offset 0 gathers the bf16 snapshot between steps, when
    # the activations (18.6 GiB > 2 B x P = 14.2 GiB) are freed, so only the bucket buffers add
    assert act > 2 * P_7B and "weight-sync snapshot (bf16)" not in eight.columns["GPU 1"]
    assert eight.total("GPU 1") == eight.total("GPU 2") + 2 * 64 * 2**20


def test_no_local_model_folder_gives_a_note_and_no_refusal(tmp_path):
    assert read_shape("")[0] is None
    shape, why = read_shape(str(tmp_path / "Qwen/Qwen2.5-7B"))
    assert shape is None and "no local config.json" in why and "never downloaded" in why
    plan = memory_plan(_config(tmp_path / "missing", "cluster: {gpu_per_node: 1}\n"))
    assert plan.problems() == [] and "no local config.json" in plan.table()


def test_vllm_reserves_its_share_of_each_of_its_gpus(tmp_path):
    config = _config(
        _model(tmp_path, "q05", QWEN_05B),
        "cluster: {gpu_per_node: 3}\nexplorer: {rollout_model: {engine_type: vllm, tensor_parallel_size: 2, "
        "gpu_memory_utilization: 0.5}}\n",
    )
    plan = memory_plan(config, capacity_gib=140)
    # each tensor-parallel worker receives every tensor in full over the nccl group, outside vLLM's reserve
    received = 2 * P_05B + 2 * 64 * 2**20
    assert (
        plan.columns["GPU 0"]
        == plan.columns["GPU 1"]
        == {"rollout (vLLM reserve)": 0.5 * 140 * GIB, "rollout weight-sync receive (bf16)": received}
    )
    assert "parameters (fp32)" in plan.columns["GPU 2"]
    assert plan.table().splitlines()[-1].split()[-1] == "140.0"  # capacity row


runner = CliRunner()


def test_config_show_prints_the_plan_and_config_check_refuses_a_7b_on_one_gpu(tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text(RUN.format(path=_model(tmp_path, "q05", QWEN_05B)) + "cluster: {gpu_per_node: 1}\n")
    shown = runner.invoke(app, ["config", "show", str(small)])
    assert shown.exit_code == 0, shown.output
    plan = shown.output.split("# memory plan")[1]
    assert "GPU 0" in plan and "optimizer (AdamW fp32)" in plan and "rollout KV cache" in plan
    assert "# capacity" in plan and "80.0" in plan and "does not fit" not in plan
    assert "shared: true" in shown.output and "weight_sync_backend: gloo" in shown.output
    assert runner.invoke(app, ["config", "check", str(small)]).exit_code == 0

    big = tmp_path / "big.yaml"
    big.write_text(RUN.format(path=_model(tmp_path, "q7", QWEN_7B)) + "cluster: {gpu_per_node: 1}\n")
    checked = runner.invoke(app, ["config", "check", str(big)])
    assert checked.exit_code == 2, checked.output
    assert (
        "the GPUs cannot hold this run" in checked.output
        and "GPU 0: the trainer and the rollout" in checked.output
    )
    assert "LoRA (model.lora_configs)" in checked.output
    assert "# does not fit: GPU 0" in runner.invoke(app, ["config", "show", str(big)]).output


QWEN_15B = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
# per layer q 1536^2+1536, k and v 1536*256+256 each, o 1536^2, MLP 3*1536*8960, norms 2*1536; tied head
P_15B = 28 * (2_360_832 + 2 * 393_472 + 2_359_296 + 41_287_680 + 3_072) + 151_936 * 1_536 + 1_536


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages created under it that are still referenced, and their peak: each
    storage is counted from the op that makes it until nothing but this tracker holds it."""

    def __init__(self, *existing: torch.Tensor) -> None:
        super().__init__()
        self.held: dict[int, torch.UntypedStorage] = {}
        self.existing = {t.untyped_storage().data_ptr() for t in existing}  # not counted
        self.live = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for ptr, storage in list(self.held.items()):
            if torch._C._storage_Use_Count(storage._cdata) == 1:
                self.live -= storage.nbytes()
                del self.held[ptr]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else [out]:
            storage = t.untyped_storage() if isinstance(t, torch.Tensor) else None
            if storage is not None and storage.data_ptr() not in (*self.held, *self.existing):
                self.held[storage.data_ptr()] = storage
                self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        return out


def test_the_logits_term_is_the_measured_peak_of_the_trainers_log_prob_path():
    """The trainer's head and log-probs (actor.policy_forward: bf16 logits, their fp32 copy, the
    shared-logsumexp log-probs and no-grad entropy), forward and backward, peak at 20 B x V per token."""
    tokens, hidden, vocab = 64, 32, 8192
    head = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    states = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    with LiveBytes(head, states) as tracker:

        def forward() -> torch.Tensor:
            logits = states @ head.t()  # the model's output, held until policy_forward returns
            log_probs, _ = logprobs_and_entropy(logits.float(), labels)
            return log_probs

        loss = -forward().mean()
        forward_peak = tracker.peak
        loss.backward()
    # forward: bf16 logits 2 + fp32 copy 4 + the no-grad entropy's exp 4 and product 4; backward
    # (logsumexp's, before the head's weight gradient exists): saved fp32 logits 4 + gather's
    # gradient 4 + z - lse 4, its exp 4, the product 4
    assert forward_peak / (tokens * vocab) == pytest.approx(14, abs=0.1)
    assert tracker.peak / (tokens * vocab) == pytest.approx(LOGITS_BYTES_PER_TOKEN_VOCAB, abs=0.1)
    config = _config(Path("unused"))
    assert logits_bytes(config, ModelShape.from_json(QWEN_05B), 100) == 100 * 20 * 151_936


def _sync_plan(tmp_path: Path, synchronizer: str, cluster: str = "{gpu_per_node: 3}", nproc: int = 2):
    model = tmp_path / "q15"
    if not model.exists():
        _model(tmp_path, "q15", QWEN_15B)
    text = RUN.format(path=model)
    text += f"cluster: {cluster}\ntrainer: {{nproc: {nproc}}}\nsynchronizer: {synchronizer}\n"
    text += "explorer: {rollout_model: {engine_type: vllm}}\n"
    return memory_plan(load_config(text=text, environ={}))


def test_nccl_weight_sync_holds_a_bf16_snapshot_on_rank_0_and_a_received_copy_on_the_engine(tmp_path):
    assert ModelShape.from_json(QWEN_15B).params == P_15B == 1_543_714_304  # Qwen2.5-1.5B
    plan = _sync_plan(tmp_path, "{sync_method: nccl, sync_offset: 1}")
    buckets = 2 * 64 * 2**20  # two of synchronizer.bucket_bytes
    # GPU 0: the vLLM engine; GPU 1: trainer rank 0 (the sender); GPU 2: rank 1
    assert plan.columns["GPU 1"]["weight-sync snapshot (bf16)"] == 2 * P_15B  # held through the next step
    assert plan.columns["GPU 1"]["weight-sync buckets"] == buckets
    assert not any(k.startswith("weight-sync") for k in plan.columns["GPU 2"])
    assert plan.columns["GPU 0"]["rollout weight-sync receive (bf16)"] == 2 * P_15B + buckets
    assert plan.total("GPU 1") == plan.total("GPU 2") + 2 * P_15B + buckets
    assert "weight-sync snapshot (bf16)" in plan.table()

    # sync_offset 0: gathered between steps, so it counts only beyond the activations it replaces
    small = _sync_plan(tmp_path, "{sync_offset: 0}", nproc=2)
    trainer = small.columns["GPU 1"]
    freed = trainer["activations"] + trainer["logits (LM head)"]
    assert trainer.get("weight-sync snapshot (bf16)", 0.0) == max(0.0, 2 * P_15B - freed)

    # the memory and checkpoint methods, a gloo group and a shared GPU go through host memory
    host = ("{sync_method: memory, sync_offset: 1}", "{sync_method: checkpoint, sync_offset: 1}")
    for synchronizer in (*host, "{sync_offset: 1, group_backend: gloo}"):
        other = _sync_plan(tmp_path, synchronizer)
        assert not any("weight-sync" in k for parts in other.columns.values() for k in parts), synchronizer
    shared = _sync_plan(tmp_path, "{sync_offset: 1}", cluster="{gpu_per_node: 1}", nproc=1)
    assert not any("weight-sync" in k for k in shared.columns["GPU 0"])


def test_the_activation_terms_are_what_a_real_decoder_keeps_with_and_without_checkpointing():
    """A real Qwen2 (transformers) in bf16, checkpointed by the trainer's own switch
    (worker.enable_gradient_checkpointing): the bytes a forward pass leaves held, per token, grow by
    2h per decoder layer with checkpointing (each layer's input) and by at most A without."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from services.trainer.worker import enable_gradient_checkpointing

    h, i, tokens = 128, 512, 128
    shape = ModelShape.from_json(
        {"hidden_size": h, "intermediate_size": i, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256}
    )  # fmt: skip

    def held(layers: int, checkpointing: bool) -> float:
        torch.manual_seed(0)
        config = Qwen2Config(
            hidden_size=h, intermediate_size=i, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256,
        )  # fmt: skip
        model = Qwen2ForCausalLM(config).to(torch.bfloat16).train()
        if checkpointing:
            enable_gradient_checkpointing(model)
        with LiveBytes(*model.parameters()) as tracker:
            model(input_ids=torch.randint(0, 256, (1, tokens)), logits_to_keep=1, use_cache=False)
            return tracker.live / tokens

    per_layer_checkpointed = (held(4, True) - held(2, True)) / 2
    per_layer = (held(4, False) - held(2, False)) / 2
    assert per_layer_checkpointed == pytest.approx(2 * h, rel=0.05)  # exactly 2h with transformers 5
    a = shape.activation_bytes_per_token_layer
    assert a == 2 * (12 * h + 2 * 64 + 4 * i) and 0.9 * a < per_layer <= a


def _gsm8k_recipe(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    _model(models, "Qwen2.5-1.5B-Instruct", QWEN_15B)
    return models


def test_the_gsm8k_recipe_fits_80_gib_gpus_with_headroom(tmp_path, monkeypatch):
    """examples/gsm8k_grpo.yaml (Qwen2.5-1.5B, vLLM on GPU 0, the trainer on GPU 1, nccl sync with
    sync_offset 1) on 80 GiB GPUs: gradient checkpointing, a 16384-token micro-batch budget and the LM
    head in 4096-token chunks."""
    models = _gsm8k_recipe(tmp_path)
    monkeypatch.setenv("RFT_MODELS", str(models))  # the recipe's ${oc.env:RFT_MODELS}
    config = load_config(ROOT / "examples" / "gsm8k_grpo.yaml", environ={})
    assert config.cluster.gpu_memory_gib == 80.0 and config.synchronizer.sync_offset == 1
    plan = memory_plan(config)
    assert plan.problems() == [] and plan.notes == []
    trainer = plan.columns["GPU 1"]
    assert trainer_plan(config, ModelShape.from_json(QWEN_15B)).tokens == 16384
    # checkpointed: each of the 28 layers keeps its bf16 input, one layer is recomputed at a time
    a = 2 * (12 * 1536 + 2 * 256 + 4 * 8960)
    assert trainer["activations"] == 16384 * (28 * 2 * 1536 + a)
    assert trainer["logits (LM head)"] == 4096 * 20 * 151_936  # one chunk
    assert trainer["weight-sync snapshot (bf16)"] == 2 * P_15B
    assert plan.total("GPU 1") / GIB == pytest.approx(48.3, abs=0.05)
    assert plan.total("GPU 0") / GIB == pytest.approx(71.0, abs=0.05)  # 0.85 x 80 + the received copy
    for gpu in plan.columns:  # headroom: at least 10% of the GPU left to what the plan leaves out
        assert plan.total(gpu) < 0.9 * 80 * GIB, gpu

    checked = runner.invoke(
        app, ["config", "check", "--skip-paths", str(ROOT / "examples" / "gsm8k_grpo.yaml")],
        env={"RFT_MODELS": str(models)},
    )  # fmt: skip
    assert checked.exit_code == 0, checked.output
    assert "memory plan: GPU 0 71.0, GPU 1 48.3 GiB of 80.0 GiB per GPU (cluster.gpu_memory_gib): fits" in (
        checked.output
    )


def test_chunked_logits_count_one_chunk_of_logits(tmp_path):
    path = _model(tmp_path, "q05", QWEN_05B)
    shape = ModelShape.from_json(QWEN_05B)
    layers = 24 * 2 * (12 * 896 + 2 * 128 + 4 * 4864)

    def plan(trainer: str) -> tuple[float, float]:
        parts = trainer_plan(_config(path, f"trainer: {{{trainer}}}\n"), shape).parts
        return parts["activations"], parts["logits (LM head)"]

    # the default chunk (4096 tokens) of a 16384-token micro-batch; 0: every token's logits at once
    assert plan("max_token_len_per_gpu: 16384") == (16384 * layers, 4096 * 20 * 151_936)
    assert plan("max_token_len_per_gpu: 16384, logits_chunk_tokens: 0") == (
        16384 * layers,
        16384 * 20 * 151_936,
    )
    assert plan("max_token_len_per_gpu: 1024, logits_chunk_tokens: 4096") == (
        1024 * layers,
        1024 * 20 * 151_936,
    )


def test_deferred_gradient_sync_holds_the_unsharded_gradients(tmp_path):
    model = _model(tmp_path, "q7", QWEN_7B)
    shape = ModelShape.from_json(QWEN_7B)
    eight = "mode: train\ncluster: {gpu_per_node: 8}\ntrainer: {nproc: 8%s}\n"

    def grads(extra: str, text: str = RUN.format(path=model)) -> float:
        config = load_config(text=text + eight % extra, environ={})
        return trainer_plan(config, shape).parts["gradients (fp32)"]

    assert grads("") == 4 * P_7B / 8  # unset: a full model on GPUs reduces every micro-batch
    assert grads(", defer_grad_sync: true") == 4 * P_7B / 8 + 4 * P_7B
    lora = RUN.format(path=model).replace("768}", "768, lora_configs: [{lora_rank: 32}]}")
    assert grads("", lora) == 4 * 80_740_352 / 8 + 4 * 80_740_352  # unset: LoRA defers, it is cheap
    assert grads(", defer_grad_sync: false", lora) == 4 * 80_740_352 / 8
