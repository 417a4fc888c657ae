"""KL controllers: the adaptive update (Ziegler et al. 2019) against pinned numbers, selection by
`kl_penalty_fn_args`, and the errors for misplaced keys."""

import pytest
import torch

from services.trainer.advantage_stage import shape_rewards_and_advantages
from services.trainer.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    TrainBatch,
    make_kl_controller,
    resolve_preset,
)


def test_adaptive_update_pinned_numbers():
    ctrl = AdaptiveKLController(value=0.1, target_kl=0.1, horizon=100)
    ctrl.update(0.15, n_steps=10)  # KL/target - 1 = 0.5, clipped to 0.2
    assert ctrl.value == pytest.approx(0.1 * 1.02)
    ctrl.update(0.09, n_steps=10)  # error -0.1
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 0.99)
    ctrl.update(0.0, n_steps=50)  # error clipped to -0.2
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 0.99 * 0.9)


def test_selected_by_kl_penalty_fn_args():
    assert make_kl_controller({"kl_coef": 0.05}) == FixedKLController(0.05)
    ctrl = make_kl_controller({"kl_coef": 0.05, "kl_ctrl": "adaptive", "target_kl": 0.2, "horizon": 50})
    assert ctrl == AdaptiveKLController(value=0.05, target_kl=0.2, horizon=50)
    assert make_kl_controller({"kl_ctrl": "adaptive"}) == AdaptiveKLController()  # veRL defaults


def test_errors_name_the_key_and_suggest():
    with pytest.raises(KeyError, match="adaptive"):
        make_kl_controller({"kl_ctrl": "adaptiv"})
    with pytest.raises(ValueError, match="target_kl"):
        make_kl_controller({"target_kl": 0.1})  # fixed takes no target
    with pytest.raises(ValueError, match="did you mean 'horizon'"):
        make_kl_controller({"kl_ctrl": "adaptive", "horizn": 10})
    with pytest.raises(ValueError, match="kl_penalty_fn"):
        resolve_preset("grpo", {"kl_penalty_fn_args": {"kl_ctrl": "adaptive"}})
    with pytest.raises(ValueError, match="must be > 0"):
        make_kl_controller({"kl_ctrl": "adaptive", "horizon": 0})


def test_reward_shaping_step_updates_the_adaptive_coefficient():
    preset = resolve_preset(
        "grpo",
        {
            "kl_penalty_fn": "k1",
            "kl_penalty_fn_args": {"kl_coef": 0.1, "kl_ctrl": "adaptive", "target_kl": 0.05, "horizon": 20},
        },
    )
    ctrl = make_kl_controller(preset.kl_penalty_fn_args)
    mask = torch.ones(4, 3)
    scores = torch.zeros(4, 3)
    scores[:, -1] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    old = torch.full((4, 3), -1.0)
    ref = torch.full((4, 3), -1.1)  # k1 = 0.1 per token -> KL 0.1 = 2 x target -> error +0.2
    batch = TrainBatch(
        response_mask=mask,
        token_level_scores=scores,
        old_log_probs=old,
        ref_log_probs=ref,
        uid=["a", "a", "b", "b"],
    )
    shaped, metrics = shape_rewards_and_advantages(batch, preset, ctrl)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.1)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)  # the coefficient used
    torch.testing.assert_close(shaped.token_level_rewards, scores - 0.1 * 0.1)
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 4 / 20))
