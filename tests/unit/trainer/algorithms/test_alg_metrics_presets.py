"""compute_data_metrics against hand computation; TrainBatch checks; algorithm presets."""

import math

import pytest
import torch

from services.trainer.algorithms import (
    PRESETS,
    AlgorithmPreset,
    TrainBatch,
    compute_data_metrics,
    get_advantage_fn,
    get_policy_loss_fn,
    resolve_preset,
)


def _batch():
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]], dtype=torch.float32)
    scores = torch.zeros(3, 4)
    scores[0, 3], scores[1, 1] = 1.0, 0.0
    rewards = scores - 0.1 * response_mask
    advantages = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, 0.0, 0.0], [0.0] * 4])
    returns = torch.tensor([[1.0, 0.9, 0.8, 0.7], [0.2, 0.1, 0.0, 0.0], [0.0] * 4])
    values = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.1, 0.1, 9.0, 9.0], [9.0] * 4])
    return TrainBatch(
        response_mask=response_mask,
        prompt_mask=prompt_mask,
        token_level_scores=scores,
        token_level_rewards=rewards,
        advantages=advantages,
        returns=returns,
        values=values,
    )


def test_compute_data_metrics_names_and_values():
    m = compute_data_metrics(_batch(), use_critic=True)
    assert m["critic/score/mean"] == pytest.approx(0.5)  # aborted sample 2 excluded
    assert (m["critic/score/max"], m["critic/score/min"]) == (1.0, 0.0)
    assert m["critic/rewards/mean"] == pytest.approx(((1 - 0.4) + (-0.2)) / 2)
    assert m["critic/advantages/mean"] == pytest.approx(2 / 6)
    assert m["critic/returns/max"] == pytest.approx(1.0) and m["critic/returns/min"] == pytest.approx(0.1)
    assert m["critic/values/max"] == pytest.approx(0.5)  # masked 9.0s ignored
    rets = [1.0, 0.9, 0.8, 0.7, 0.2, 0.1]
    vals = [0.5, 0.5, 0.5, 0.5, 0.1, 0.1]
    diffs = [r - v for r, v in zip(rets, vals, strict=True)]

    def var(xs):
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)

    assert m["critic/vf_explained_var"] == pytest.approx(1 - var(diffs) / (var(rets) + 1e-5), rel=1e-5)
    assert m["response_length/mean"] == pytest.approx(2.0)
    assert (m["response_length/max"], m["response_length/min"]) == (4.0, 0.0)
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert m["response_length_non_aborted/mean"] == pytest.approx(3.0)
    assert m["response_length_non_aborted/clip_ratio"] == pytest.approx(0.5)
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    assert m["prompt_length/mean"] == pytest.approx(2.0)
    assert m["prompt_length/clip_ratio"] == pytest.approx(1 / 3)
    assert all(math.isfinite(v) for v in m.values())


def test_compute_data_metrics_without_critic_and_all_aborted():
    m = compute_data_metrics(_batch(), use_critic=False)
    assert not any(k.startswith("critic/values") or k == "critic/vf_explained_var" for k in m)
    empty = _batch().replace(response_mask=torch.zeros(3, 4))
    m = compute_data_metrics(empty, use_critic=True)
    assert m["response/aborted_ratio"] == 1.0 and m["critic/score/mean"] == 0.0
    assert all(math.isfinite(v) for v in m.values())
    with pytest.raises(ValueError, match="TrainBatch.values"):
        compute_data_metrics(_batch().replace(values=None), use_critic=True)


def test_train_batch_checks_shapes_and_is_frozen():
    batch = _batch()
    with pytest.raises(ValueError, match=r"advantages has shape \(3, 5\)"):
        batch.replace(advantages=torch.zeros(3, 5))
    with pytest.raises(ValueError, match="uid must be a sequence of 3"):
        batch.replace(uid=["a"])
    with pytest.raises(ValueError, match="reward_baselines"):
        batch.replace(reward_baselines=torch.zeros(2))
    with pytest.raises(AttributeError):
        batch.advantages = None  # type: ignore[misc]
    assert batch.replace(uid=["a", "b", "a"]).uid == ("a", "b", "a")
    assert (batch.batch_size, batch.response_length) == (3, 4)


def test_every_preset_resolves_to_registered_functions():
    from services.common.config.algorithm import ALGORITHM_TYPES

    # every algorithm_type the config accepts has a preset (an accepted name that crashes at the
    # first step is what this guards against)
    assert set(ALGORITHM_TYPES) <= set(PRESETS), set(ALGORITHM_TYPES) - set(PRESETS)
    for name in ALGORITHM_TYPES:
        preset = resolve_preset(name)
        assert preset.algorithm_type == name
        if preset.advantage_fn is not None:
            get_advantage_fn(preset.advantage_fn)
        get_policy_loss_fn(preset.policy_loss_fn).config_cls.from_dict(preset.policy_loss_fn_args)
    assert set(PRESETS) >= {"ppo", "grpo", "dapo", "sft", "dpo"}


def test_dapo_preset():
    dapo = resolve_preset("dapo")
    assert dapo.advantage_fn == "grpo" and dapo.policy_loss_fn == "ppo"
    cfg = get_policy_loss_fn("ppo").config_cls.from_dict(dapo.policy_loss_fn_args)
    assert (cfg.low, cfg.high) == (0.2, 0.28)
    assert dapo.loss_agg_mode == "token-mean"
    assert dapo.reward_manager == "dapo" and dapo.reward_manager_args["overlong_buffer"]["enable"] is True
    assert not dapo.use_kl_loss and not dapo.use_critic


def test_ppo_and_sft_presets():
    ppo = resolve_preset("ppo")
    assert (
        ppo.use_critic
        and ppo.advantage_fn == "gae"
        and dict(ppo.advantage_fn_args) == {"gamma": 1.0, "lam": 1.0}
    )
    assert ppo.kl_loss_fn == "k2" and ppo.kl_loss_fn_args["kl_coef"] == 0.001
    sft = resolve_preset("sft")
    assert sft.advantage_fn is None and sft.policy_loss_fn == "sft" and not sft.use_reference


def test_overrides_fill_and_win():
    p = resolve_preset("grpo", {"policy_loss_fn_args": {"clip_ratio_high": 0.3}, "loss_agg_mode": None})
    assert dict(p.policy_loss_fn_args) == {"clip_ratio_high": 0.3} and p.loss_agg_mode == "token-mean"
    merged = resolve_preset("dapo", {"policy_loss_fn_args": {"clip_ratio_c": 10.0}})
    assert dict(merged.policy_loss_fn_args) == {
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 10.0,
    }
    switched = resolve_preset("dapo", {"policy_loss_fn": "cispo"})
    assert dict(switched.policy_loss_fn_args) == {}  # dapo's PPO args do not leak into CISPO
    alias = resolve_preset("dapo", {"policy_loss_fn": "vanilla"})
    assert alias.policy_loss_fn_args["clip_ratio_high"] == 0.28  # same function under its other name
    kl = resolve_preset("dapo", {"kl_loss_fn": "low_var_kl"})
    assert kl.use_kl_loss and kl.kl_loss_fn_args["kl_coef"] == 0.001


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        ({"advantge_fn": "grpo"}, ValueError, "did you mean 'advantage_fn'"),
        ({"advantage_fn": "gpro"}, KeyError, "did you mean 'grpo'"),
        ({"advantage_fn_args": {"epsilom": 1e-6}}, ValueError, "did you mean 'epsilon'"),
        ({"policy_loss_fn_args": {"clip_ratio_hi": 0.3}}, ValueError, "unknown key 'clip_ratio_hi'"),
        ({"kl_loss_fn": "k4"}, KeyError, "unknown KL estimator 'k4'"),
        ({"kl_loss_fn_args": {"coef": 0.1}}, ValueError, "did you mean 'kl_coef'"),
        ({"loss_agg_mode": "tokens-mean"}, ValueError, "loss_agg_mode"),
        ({"entropy_loss_fn": "mix"}, ValueError, "entropy_loss_fn"),
        ({"reward_manager_args": {"overlong_buffer": {"lenn": 3}}}, ValueError, "unknown key 'lenn'"),
    ],
)
def test_bad_overrides_fail_with_names(overrides, error, match):
    with pytest.raises(error, match=match):
        resolve_preset("dapo" if "reward_manager_args" in overrides else "grpo", overrides)


def test_unknown_algorithm_type_suggests():
    with pytest.raises(ValueError, match="unknown algorithm_type 'rlooo'.*did you mean 'rloo'"):
        resolve_preset("rlooo")
    with pytest.raises(AttributeError):
        AlgorithmPreset(algorithm_type="x").repeat_times = 3  # type: ignore[misc]


def test_plugin_functions_by_dotted_path():
    p = resolve_preset(
        "grpo",
        {
            "advantage_fn": "services.trainer.algorithms:compute_rloo_outcome_advantage",
            "policy_loss_fn": "services.trainer.algorithms:compute_policy_loss_gpg",
        },
    )
    assert get_advantage_fn(p.advantage_fn) is get_advantage_fn("rloo")
    assert get_policy_loss_fn(p.policy_loss_fn) is get_policy_loss_fn("gpg")
    with pytest.raises(ImportError, match="no_such_pkg"):
        resolve_preset("grpo", {"policy_loss_fn": "no_such_pkg.mod:loss"})
