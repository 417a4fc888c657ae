"""The memory plan's formulas pinned against hand-computed numbers, on config.json files shaped as
Qwen2.5-0.5B and Qwen2.5-7B (written here; no weights, no download, no GPU): parameter counts, each
trainer and rollout component, a 7B full fine-tune refused on one 80 GiB GPU and accepted with LoRA
(and gradient checkpointing) or with 8 trainer ranks; `rft config show` prints the plan and `rft config
check` refuses the misfit with exit code 2, naming the numbers and the fixes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from services.common.config import load_config
from services.common.config.memory_plan import (
    GIB,
    ModelShape,
    hf_engine_bytes,
    memory_plan,
    read_shape,
    trainer_plan,
    uses_critic,
    uses_reference,
)

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
    # per token: 24 layers x 2 B x (12 x 896 + 2 x 128 + 4 x 4864) + 10 B x 151936 logits
    per_token = 24 * 2 * (12 * 896 + 2 * 128 + 4 * 4864) + 10 * 151_936
    assert per_token == 2_981_632
    assert trainer.parts == {
        "parameters (fp32)": 4 * P_05B,
        "gradients (fp32)": 4 * P_05B,
        "optimizer (AdamW fp32)": 8 * P_05B,
        "gathered bf16": 2 * P_05B,  # one rank keeps every unsharded bf16 parameter
        "reference (bf16)": 2 * P_05B,  # GRPO's default k2 KL loss reads the reference
        "activations": 2048 * 2_981_632,
        "margin": MARGIN,
    }
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
    assert plan.total("GPU 0") == 20 * P_05B + 2048 * 2_981_632 + 2 * P_05B + kv + 2 * MARGIN
    assert plan.total("GPU 0") / GIB == pytest.approx(20.6, abs=0.05)
    assert plan.problems() == []
    assert plan.rollout_cap_bytes == 0.3 * 80 * GIB


def test_gradient_checkpointing_keeps_one_layer_and_the_layer_inputs(tmp_path):
    config = _config(
        _model(tmp_path, "q05", QWEN_05B),
        "trainer: {trainer_config: {actor_rollout_ref: {model: {enable_gradient_checkpointing: true}}}}\n",
    )
    a = 2 * (12 * 896 + 2 * 128 + 4 * 4864)
    assert trainer_plan(config, ModelShape.from_json(QWEN_05B)).parts["activations"] == 2048 * (
        24 * 2 * 896 + a + 10 * 151_936
    )


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
    # optimizer state comes back for the step only, when activations (6.1 GB) are freed: 8P = 3.95 GB fits
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
    assert plan.problems() == [] and plan.total("GPU 0") / GIB == pytest.approx(69.3, abs=0.1)
    eight = memory_plan(_config(model, "cluster: {node_num: 2, gpu_per_node: 8}\ntrainer: {nproc: 8}\n"))
    assert list(eight.columns) == [f"GPU {g}" for g in range(9)]  # explorer on 0, 8 trainer ranks
    assert eight.problems() == []
    # 16 B x P / 8 (fp32 weights, grads, AdamW), gathered root + 2 layers, bf16 reference / 8, 2048 tokens
    gathered = 2 * (2 * 152_064 * 3_584 + 3_584 + 2 * 233_057_792)
    act = 2048 * (28 * 2 * (12 * 3584 + 2 * 512 + 4 * 18944) + 10 * 152_064)
    assert eight.total("GPU 1") == 2 * P_7B + gathered + P_7B / 4 + act + MARGIN
    assert eight.total("GPU 1") / GIB == pytest.approx(36.6, abs=0.05)


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
    assert plan.columns["GPU 0"] == plan.columns["GPU 1"] == {"rollout (vLLM reserve)": 0.5 * 140 * GIB}
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


def test_chunked_logits_count_one_chunk_of_logits(tmp_path):
    path = _model(tmp_path, "q05", QWEN_05B)
    shape = ModelShape.from_json(QWEN_05B)
    layers = 24 * 2 * (12 * 896 + 2 * 128 + 4 * 4864)

    def activations(trainer: str) -> float:
        return trainer_plan(_config(path, f"trainer: {{{trainer}}}\n"), shape).parts["activations"]

    # the default chunk (4096 tokens) of a 16384-token micro-batch; 0: every token's logits at once
    assert activations("max_token_len_per_gpu: 16384") == 16384 * layers + 4096 * 10 * 151_936
    full = activations("max_token_len_per_gpu: 16384, logits_chunk_tokens: 0")
    assert full == 16384 * (layers + 10 * 151_936)
    assert activations("max_token_len_per_gpu: 1024, logits_chunk_tokens: 4096") == 1024 * (
        layers + 10 * 151_936
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
