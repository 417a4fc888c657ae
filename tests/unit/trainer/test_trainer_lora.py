"""LoRA training (`model.lora_configs`) on the tiny model: only the adapter moves, the reference is
the base model, checkpoints resume exactly, and the HF export is the merged model plus the adapter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from launcher.tiny_model import make_tiny_model
from services.common.config import ConfigError, load_config
from services.trainer.collate import collate
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from services.weight_sync.methods.lora import adapter_targets, merge_adapter, read_base_weights
from tests.support.trainer_data import make_config, make_experiences

torch.set_num_threads(1)
LORA = {"name": "default", "lora_rank": 4, "lora_alpha": 8}
ALGORITHM = {"kl_loss_fn": "k3", "optimizer": {"lr": 1e-2, "weight_decay": 0.0}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def make_engine(model_dir, root, lora: dict | None = LORA, **sections) -> FSDPEngine:
    model = {"model_path": str(model_dir), "lora_configs": [lora] if lora else []}
    config = make_config(model_dir, root, model=model, algorithm=ALGORITHM, **sections)
    return FSDPEngine(TrainerSettings.from_config(config), ensure_process_group())


def steps(n: int = 2) -> list:
    return [collate(make_experiences(8, group_size=4, seed=10 + i)) for i in range(n)]


def logprobs(engine: FSDPEngine, step) -> torch.Tensor:
    return engine.worker.actor.compute_log_prob(step) * step.batch.response_mask


def params(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.worker.policy.named_parameters()}


def test_a_lora_step_moves_only_the_adapter(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path)
    optimized = {id(p) for g in engine.worker.actor.optimizer.param_groups for p in g["params"]}
    trainable = {n for n, p in engine.worker.policy.named_parameters() if id(p) in optimized}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert engine.worker.ref is not None and engine.worker.ref.module is engine.worker.policy  # no 2nd model
    before = params(engine)
    metrics = engine.train_step(steps(1)[0])
    assert metrics["actor/grad_norm"] > 0
    after = params(engine)
    for name, value in before.items():
        if name in trainable:
            continue
        assert torch.equal(value, after[name]), name  # base weights bit-equal
    moved = [n for n in trainable if ".lora_B." in n and not torch.equal(before[n], after[n])]
    assert len(moved) == len([n for n in trainable if ".lora_B." in n])


def test_reference_logprobs_are_the_base_models(model_dir, tmp_path):
    lora = make_engine(model_dir, tmp_path / "lora")
    base = make_engine(model_dir, tmp_path / "base", lora=None)
    step, probe = steps(2)
    lora.train_step(step)
    ref = lora.worker.ref.compute_log_prob(probe) * probe.batch.response_mask
    torch.testing.assert_close(ref, logprobs(base, probe), rtol=0, atol=1e-5)
    assert (logprobs(lora, probe) - ref).abs().max() > 1e-3  # the adapted policy has moved away


def test_save_and_restore_resume_identically(model_dir, tmp_path):
    first, second = steps(2)
    a = make_engine(model_dir, tmp_path)
    a.train_step(first)
    folder = a.save_checkpoint(1, {"global_step": 1}, save_as_hf=False, block=True)
    metrics_a = a.train_step(second)
    saved = load_file(f"{folder}/actor/model.safetensors")  # the adapter only: base weights are the model's
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)
    b = make_engine(model_dir, tmp_path / "other")
    assert b.load_checkpoint(folder)["global_step"] == 1
    metrics_b = b.train_step(second)
    for name, value in params(a).items():
        assert torch.equal(value, params(b)[name]), name
    assert metrics_a["actor/pg_loss"] == metrics_b["actor/pg_loss"]
    assert metrics_a["actor/kl_loss"] == metrics_b["actor/kl_loss"]


def test_hf_export_is_the_merged_model_and_the_adapter(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path)
    engine.train_step(steps(1)[0])
    folder = engine.save_checkpoint(1, {}, save_as_hf=True, block=True)
    hf = AutoModelForCausalLM.from_pretrained(f"{folder}/huggingface", dtype=torch.float32).eval()
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(12)[None]  # one packed row: the trainer's attention reads position_ids
    policy = engine.worker.policy.eval()
    with torch.no_grad():
        adapted = policy(input_ids=ids, position_ids=pos, use_cache=False).logits
        merged = hf(input_ids=ids, position_ids=pos, use_cache=False).logits
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        peft_loaded = PeftModel.from_pretrained(base, f"{folder}/huggingface/lora_adapter").eval()
        from_adapter = peft_loaded(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(merged, adapted, rtol=0, atol=1e-4)
    torch.testing.assert_close(from_adapter, adapted, rtol=0, atol=1e-4)
    synced = dict(engine.iter_state_dict())  # weight sync: the same merged tensors, base names
    assert set(synced) == set(hf.state_dict()) | ({"lm_head.weight"} & set(synced))
    for name, value in hf.state_dict().items():
        torch.testing.assert_close(synced[name], value, rtol=0, atol=0)


def test_adapter_only_sync_merges_on_the_explorer_to_the_same_bits(model_dir, tmp_path):
    """`sync_method: lora_adapter`: the trainer gathers only A, B and the scaling per adapted weight;
    merged into the base weights read from the model folder they equal the merged sync bit for bit,
    for a fraction of the bytes. A policy without LoRA refuses the adapter-only gather by name."""
    engine = make_engine(model_dir, tmp_path)
    engine.train_step(steps(1)[0])
    adapter = dict(engine.iter_state_dict("adapter"))
    synced = dict(engine.iter_state_dict())
    names = adapter_targets(adapter)
    assert names and all(n in synced for n in names)
    merged = merge_adapter(read_base_weights(model_dir, names), adapter)
    for name in names:
        assert torch.equal(merged[name], synced[name]), name
    base = read_base_weights(model_dir, names)
    assert any(not torch.equal(base[n], synced[n]) for n in names)  # the step moved the adapter
    nbytes = lambda sd: sum(t.numel() * t.element_size() for t in sd.values())  # noqa: E731
    assert nbytes(adapter) < 0.5 * nbytes(synced), (nbytes(adapter), nbytes(synced))
    plain = make_engine(model_dir, tmp_path / "plain", lora=None)
    with pytest.raises(ValueError, match="model.lora_configs is empty"):
        dict(plain.iter_state_dict("adapter"))


def test_path_starts_from_a_saved_adapter(model_dir, tmp_path):
    trained = make_engine(model_dir, tmp_path / "a")
    first, probe = steps(2)
    trained.train_step(first)
    folder = trained.save_checkpoint(1, {}, save_as_hf=True, block=True)
    resumed = make_engine(model_dir, tmp_path / "b", lora={"path": f"{folder}/huggingface/lora_adapter"})
    torch.testing.assert_close(logprobs(resumed, probe), logprobs(trained, probe), rtol=0, atol=1e-6)
    with pytest.raises(FileNotFoundError, match=r"model.lora_configs\[0\].path: .* no adapter_config.json"):
        make_engine(model_dir, tmp_path / "c", lora={"path": str(tmp_path)})


def test_config_takes_one_adapter_and_refuses_other_dtypes():
    text = "model: {model_path: m, lora_configs: [{lora_rank: 4}, {lora_rank: 8}]}"
    with pytest.raises(ConfigError, match=r"model.lora_configs has 2 entries; one trained adapter"):
        load_config(text=text)
    with pytest.raises(ConfigError, match=r"model.lora_configs\[0\].lora_dtype|lora_configs.0.lora_dtype"):
        load_config(text="model: {model_path: m, lora_configs: [{lora_dtype: bfloat16}]}")
    config = load_config(
        text="model: {model_path: m, lora_configs: [{lora_rank: 8, target_modules: [q_proj]}]}"
    )
    lora = TrainerSettings.from_config(config).lora
    assert lora is not None and (lora.rank, lora.alpha, lora.target_modules) == (8, 32, ("q_proj",))


def test_the_docs_snippet_loads():
    section = (Path(__file__).resolve().parents[3] / "docs" / "lora.md").read_text()
    snippet = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    [lora] = load_config(text=snippet).model.lora_configs
    assert (lora.lora_rank, lora.lora_alpha, lora.target_modules) == (8, 16, "all-linear")


def test_a_one_rank_fsdp2_lora_step_equals_the_plain_one(model_dir, tmp_path):
    """The adapter is added before `fully_shard` (the GPU layout, here forced on one CPU rank)."""
    step = steps(1)[0]
    runs = {}
    for fsdp in (False, True):
        model = {"model_path": str(model_dir), "lora_configs": [LORA]}
        config = make_config(model_dir, tmp_path / str(fsdp), model=model, algorithm=ALGORITHM)
        engine = FSDPEngine(TrainerSettings.from_config(config), ensure_process_group(), fsdp=fsdp)
        metrics = engine.train_step(step)
        runs[fsdp] = (metrics["actor/grad_norm"], dict(engine.iter_state_dict()))
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-5)
    assert runs[True][1].keys() == runs[False][1].keys()
    for name, value in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][name], value, rtol=0, atol=1e-6)
