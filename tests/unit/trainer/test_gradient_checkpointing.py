"""veRL's `actor_rollout_ref.model.enable_gradient_checkpointing` in `trainer.trainer_config`: the policy
recomputes its activations in the backward pass, and a step gives the same loss and gradients."""

from __future__ import annotations

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.trainer.collate import collate
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings, unused_trainer_config_keys
from tests.support.trainer_data import make_config, make_experiences

torch.set_num_threads(1)
CHECKPOINTING = {"trainer_config": {"actor_rollout_ref": {"model": {"enable_gradient_checkpointing": True}}}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def engine(model_dir, root, **trainer) -> FSDPEngine:
    config = make_config(
        model_dir, root, trainer={"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 4, **trainer}
    )
    return FSDPEngine(TrainerSettings.from_config(config), ensure_process_group())


def test_the_key_is_read_and_switches_checkpointing_on(model_dir, tmp_path):
    config = make_config(model_dir, tmp_path, trainer=CHECKPOINTING)
    assert TrainerSettings.from_config(config).gradient_checkpointing
    assert unused_trainer_config_keys(config) == []
    on = engine(model_dir, tmp_path / "on", **CHECKPOINTING)
    off = engine(model_dir, tmp_path / "off")
    assert on.worker.policy.is_activation_checkpointing
    assert not off.worker.policy.is_activation_checkpointing


def test_a_step_with_checkpointing_gives_the_same_loss_and_grads(model_dir, tmp_path):
    exps = make_experiences(8, group_size=4, seed=5)
    for i, e in enumerate(exps):
        e.reward = float(i % 3 == 0)
    on = engine(model_dir, tmp_path / "on", **CHECKPOINTING)
    off = engine(model_dir, tmp_path / "off")
    saved = {"on": 0, "off": 0}  # bytes of tensors kept for the backward pass

    def step(key: str, eng: FSDPEngine) -> dict[str, float]:
        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[key] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return eng.train_step(collate(exps))

    m_on, m_off = step("on", on), step("off", off)
    print(f"saved for backward: {saved['on']} bytes with checkpointing, {saved['off']} without")
    assert 0 < saved["on"] < 0.8 * saved["off"], saved  # the layers' activations are recomputed instead
    assert m_on["actor/pg_loss"] == pytest.approx(m_off["actor/pg_loss"], abs=1e-6)
    assert m_on["actor/grad_norm"] == pytest.approx(m_off["actor/grad_norm"], rel=1e-5)
    assert m_off["actor/grad_norm"] > 0
    for (name, p_on), (_, p_off) in zip(
        on.worker.policy.named_parameters(), off.worker.policy.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p_on.grad, p_off.grad, atol=1e-6, rtol=1e-5, msg=name)
