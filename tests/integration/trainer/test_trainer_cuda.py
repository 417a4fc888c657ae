"""The trainer on a CUDA device (gpu tier; skipped without CUDA), on the tiny model, world size 1: the bf16
FSDP2 step with each feature a user turns on (gradient checkpointing, LoRA, reference model + KL loss,
the PPO critic), a save and a bit-exact restore of model and optimizer state, the resumed run continuing
as the straight one does (within bf16 kernel nondeterminism), and the HF export loading as the trained
weights. Run by step `pytest` of scripts/gpu_check.sh; on CPU the same features are covered by
tests/unit/trainer."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from launcher.tiny_model import make_tiny_model
from services.trainer.checkpoint import find_latest
from services.trainer.collate import collate
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.fsdp import full_state_dict
from services.trainer.settings import TrainerSettings
from tests.support.trainer_data import make_config, make_experiences

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CHECKPOINTING = {"trainer_config": {"actor_rollout_ref": {"model": {"enable_gradient_checkpointing": True}}}}
FEATURES = {
    "grpo": {},
    "gradient_checkpointing": {"trainer": CHECKPOINTING},
    "lora": {"model": {"lora_configs": [{"name": "default", "lora_rank": 4, "lora_alpha": 8}]}},
    "reference_kl": {"algorithm": {"kl_loss_fn": "k3"}},
    "critic": {
        "algorithm": {"algorithm_type": "ppo", "repeat_times": 1, "kl_loss_fn": "none"},
        "buffer": {"batch_size": 8},
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def make_engine(model_dir, root, **sections) -> FSDPEngine:
    model = {"model_path": str(model_dir), **sections.pop("model", {})}
    algorithm = {"optimizer": {"lr": 1e-3, "weight_decay": 0.01}, **sections.pop("algorithm", {})}
    trainer = {"micro_batch_size_per_gpu": 4, **sections.pop("trainer", {})}
    config = make_config(model_dir, root, model=model, algorithm=algorithm, trainer=trainer, **sections)
    return FSDPEngine(TrainerSettings.from_config(config), ensure_process_group())


def steps(n: int) -> list:
    return [collate(make_experiences(8, group_size=4, seed=300 + i)) for i in range(n)]


def state(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    """The fp32 master weights on CPU (`iter_state_dict` gives the wire dtype: bf16 on CUDA)."""
    return full_state_dict(engine.worker.policy)


def test_weights_for_sync_are_the_master_weights_in_bf16(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path)
    engine.train_step(steps(1)[0])
    master = state(engine)
    wire = dict(engine.iter_state_dict())
    assert wire.keys() == master.keys()
    for name, value in wire.items():
        assert value.dtype == torch.bfloat16, name
        assert torch.equal(value.cpu(), master[name].to(torch.bfloat16)), name
    engine.close()


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_bf16_fsdp2_step_with_each_feature(model_dir, tmp_path, feature):
    engine = make_engine(model_dir, tmp_path, **{k: dict(v) for k, v in FEATURES[feature].items()})
    assert engine.worker.fsdp and engine.worker.info.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in engine.worker.policy.parameters())
    if feature == "reference_kl":
        assert engine.worker.ref is not None
    if feature == "critic":
        assert engine.worker.critic is not None
    before = state(engine)
    for step in steps(2):
        metrics = engine.train_step(step)
        assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
        assert torch.isfinite(torch.tensor(metrics["actor/grad_norm"])) and metrics["actor/grad_norm"] > 0
    if feature == "reference_kl":
        assert "actor/kl_loss" in metrics
    if feature == "critic":
        assert torch.isfinite(torch.tensor(metrics["critic/vf_loss"]))
    after = state(engine)
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight moved"
    engine.close()


def optimizer_state(engine: FSDPEngine) -> list[torch.Tensor]:
    out = []
    for group in engine.worker.actor.optimizer.state.values():
        for value in group.values():
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                out.append(local.detach().cpu().clone())
    return out


def test_save_restores_bit_exact_and_resume_continues(model_dir, tmp_path):
    batches = steps(4)
    straight = make_engine(model_dir, tmp_path / "straight", algorithm={"kl_loss_fn": "k3"})
    straight_metrics = [straight.train_step(b) for b in batches]
    straight_state = state(straight)
    straight.close()

    first = make_engine(model_dir, tmp_path / "resumed", algorithm={"kl_loss_fn": "k3"})
    for b in batches[:2]:
        first.train_step(b)
    first.save_checkpoint(2, {"global_step": 2}, save_as_hf=True, block=True)
    saved_model, saved_optim = state(first), optimizer_state(first)
    first.close()

    second = make_engine(model_dir, tmp_path / "resumed", algorithm={"kl_loss_fn": "k3"})
    folder = find_latest(second.worker.settings.job_dir)
    assert folder is not None and folder.name == "global_step_2"
    second.load_checkpoint(str(folder))
    loaded_model, loaded_optim = state(second), optimizer_state(second)
    assert loaded_model.keys() == saved_model.keys()
    assert all(torch.equal(loaded_model[k], saved_model[k]) for k in saved_model)  # bit-exact restore
    assert len(loaded_optim) == len(saved_optim) > 0
    assert all(torch.equal(a, b) for a, b in zip(loaded_optim, saved_optim, strict=True))

    resumed_metrics = [second.train_step(b) for b in batches[2:]]
    for got, want in zip(resumed_metrics, straight_metrics[2:], strict=True):
        assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], abs=2e-2)
    resumed_state = state(second)
    for k, v in straight_state.items():
        torch.testing.assert_close(resumed_state[k], v, atol=2e-3, rtol=2e-2)

    # the HF export of step 2 loads with from_pretrained and computes what the saved weights compute
    hf = folder / "huggingface"
    exported = AutoModelForCausalLM.from_pretrained(hf).eval()
    reference = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    reference.load_state_dict(saved_model)
    ids = torch.tensor([[5, 17, 42, 7, 9, 11]])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, reference(ids).logits)
    second.close()


def test_rollout_probs_diff_of_cuda_tensors():
    from services.trainer.algorithms.metrics import rollout_probs_diff

    rollout = torch.log(torch.tensor([[0.5, 0.25, 0.9]], device="cuda"))
    old = torch.log(torch.tensor([[0.4, 0.25, 0.1]], device="cuda"))
    mask = torch.tensor([[1, 1, 0]], device="cuda")
    got = rollout_probs_diff(rollout, old, mask)
    assert got.device.type == "cpu" and got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor([0.1, 2.0, 0.1], dtype=torch.float64), atol=1e-6, rtol=0)
