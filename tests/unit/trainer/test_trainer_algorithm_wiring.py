"""ReMax baselines, the adaptive KL controller and rollout IS correction through the real trainer
step on the tiny model (world size 1): config -> settings -> worker -> metrics and checkpoints."""

from __future__ import annotations

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.buffer.validation import ValidationError, validate_experience
from services.common.experience import batch_from_proto, batch_to_proto
from services.trainer.collate import collate
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from tests.support.trainer_data import make_config, make_experiences

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def _engine(model_dir, root, **algorithm) -> FSDPEngine:
    config = make_config(model_dir, root, algorithm=algorithm)
    return FSDPEngine(TrainerSettings.from_config(config), ensure_process_group())


def test_remax_baseline_travels_the_proto_and_sets_the_advantage(model_dir, tmp_path):
    exps = make_experiences(8, group_size=4, seed=2)
    for i, e in enumerate(exps):
        e.reward_baseline = 0.25 * (i % 3)
    exps = batch_from_proto(batch_to_proto(exps))  # explorer -> buffer -> trainer
    assert [e.reward_baseline for e in exps] == [0.25 * (i % 3) for i in range(8)]
    step = collate(exps)
    engine = _engine(model_dir, tmp_path, algorithm_type="remax", repeat_times=4)
    metrics = engine.train_step(step)
    mask = step.batch.response_mask
    adv = torch.stack([torch.tensor(e.reward - e.reward_baseline).expand(mask.shape[1]) for e in exps])
    expected = float((adv * mask).sum() / mask.sum())
    assert metrics["critic/advantages/mean"] == pytest.approx(expected, abs=1e-6)
    for e in exps:
        e.reward_baseline = None
    with pytest.raises(ValueError, match="reward_baseline"):
        engine.train_step(collate(exps))


def test_non_finite_reward_baseline_is_refused_by_the_buffer():
    exp = make_experiences(1)[0]
    exp.reward_baseline = float("nan")
    msg = batch_to_proto([exp]).experiences[0]
    with pytest.raises(ValidationError, match="reward_baseline"):
        validate_experience(msg, 0, 0)


def test_adaptive_kl_coefficient_moves_and_is_checkpointed(model_dir, tmp_path):
    engine = _engine(
        model_dir,
        tmp_path,
        kl_penalty_fn="k1",
        kl_penalty_fn_args={"kl_coef": 0.1, "kl_ctrl": "adaptive", "target_kl": 0.05, "horizon": 40},
    )
    step = collate(make_experiences(8, group_size=4, seed=3))
    m1 = engine.train_step(step)
    # step 1: the policy is the reference, KL 0 -> error -0.2 -> beta x (1 - 0.2 x 8/40)
    assert m1["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert m1["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1 * 0.96)
    m2 = engine.train_step(step)
    assert m2["actor/reward_kl_penalty_coeff"] != pytest.approx(m1["actor/reward_kl_penalty_coeff"])
    folder = engine.save_checkpoint(2, {"global_step": 2}, save_as_hf=False, block=True)
    fresh = _engine(
        model_dir,
        tmp_path / "other",
        kl_penalty_fn="k1",
        kl_penalty_fn_args={"kl_coef": 0.1, "kl_ctrl": "adaptive", "target_kl": 0.05, "horizon": 40},
    )
    fresh.load_checkpoint(folder)
    assert fresh.worker.kl_ctrl.value == pytest.approx(m2["actor/reward_kl_penalty_coeff"])


def test_verl_kl_ctrl_keys_in_trainer_config_select_the_controller(model_dir, tmp_path):
    config = make_config(
        model_dir,
        tmp_path,
        algorithm={"kl_penalty_fn": "kl"},
        trainer={"trainer_config": {"algorithm": {"kl_ctrl": {"type": "adaptive", "horizon": 500}}}},
    )
    args = TrainerSettings.from_config(config).preset.kl_penalty_fn_args
    assert args["kl_ctrl"] == "adaptive" and args["horizon"] == 500 and args["kl_coef"] == 0.001


def test_rollout_is_weights_reach_the_loss_and_log_mismatch_metrics(model_dir, tmp_path):
    exps = make_experiences(8, group_size=4, seed=4)
    g = torch.Generator().manual_seed(0)
    for e in exps:  # rollout log-probs that differ from the trainer's
        e.logprobs = -1.0 - torch.rand(e.response_length, generator=g)
    step = collate(exps)
    plain = _engine(model_dir, tmp_path / "a").train_step(step)
    assert not any(k.startswith("mismatch/") for k in plain)
    engine = _engine(
        model_dir, tmp_path / "b", rollout_is=True, rollout_is_threshold=2.0, rollout_is_mode="mask"
    )
    assert engine.worker.settings.recompute_old_log_probs  # the weights need pi_old before the update
    metrics = engine.train_step(step)
    assert metrics["mismatch/rollout_is_mean"] > 0 and metrics["mismatch/rollout_is_masked_fraction"] > 0
    assert metrics["actor/pg_loss"] != pytest.approx(plain["actor/pg_loss"])


def test_rollout_is_config_errors_at_load(model_dir, tmp_path):
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        make_config(model_dir, tmp_path, algorithm={"rollout_is": True})
    with pytest.raises(ValueError, match="rollout_is_level"):
        make_config(model_dir, tmp_path, algorithm={"rollout_is_threshold": 2.0, "rollout_is_level": "seq"})
