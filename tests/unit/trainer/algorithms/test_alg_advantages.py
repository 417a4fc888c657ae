"""Advantage estimators against per-sample loop references, pinned numbers and edge cases."""

import math
import statistics

import pytest
import torch

from services.trainer.algorithms import (
    TrainBatch,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_advantage_fn,
)

INDEX = ["a", "a", "a", "b", "b", "c"]  # groups of 3, 2 and 1


def _outcome_batch(seed=0, bs=6, length=5):
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 3, 1, 4, 2, 5][:bs]
    mask = torch.zeros(bs, length)
    rewards = torch.zeros(bs, length)
    scores = torch.randint(0, 3, (bs,), generator=g).float() + torch.rand(bs, generator=g)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        rewards[i, n - 1] = scores[i]
    return rewards, mask, scores.tolist()


def _groups(index):
    out = {}
    for i, k in enumerate(index):
        out.setdefault(k, []).append(i)
    return out


def _check_broadcast(adv, mask, per_sample):
    for i, a in enumerate(per_sample):
        for t in range(adv.shape[1]):
            assert adv[i, t].item() == pytest.approx(a * mask[i, t].item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_loop(norm):
    rewards, mask, scores = _outcome_batch()
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, INDEX, norm_adv_by_std_in_grpo=norm)
    assert adv is ret or torch.equal(adv, ret)
    expected = []
    groups = _groups(INDEX)
    for i, k in enumerate(INDEX):
        members = [scores[j] for j in groups[k]]
        mean, std = (0.0, 1.0) if len(members) == 1 else (statistics.mean(members), statistics.stdev(members))
        expected.append((scores[i] - mean) / (std + 1e-6) if norm else scores[i] - mean)
    _check_broadcast(adv, mask, expected)


def test_grpo_pinned():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.5, 0.0], [2.0, 0.0]])
    mask = torch.ones(4, 2)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, [0, 0, 0, 1])
    # group 0: scores 1, 0, 0.5 -> mean 0.5, std 0.5; group 1 alone: 2 / (1 + 1e-6)
    assert adv[:, 0].tolist() == pytest.approx([0.999998, -0.999998, 0.0, 1.999998], abs=1e-6)


def test_grpo_equal_rewards_give_exact_zero_and_single_group():
    rewards = torch.full((3, 4), 0.0)
    rewards[:, -1] = 0.3
    adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(3, 4), ["x", "x", "x"])
    assert adv.abs().max().item() == 0.0
    single, _ = compute_grpo_outcome_advantage(rewards[:1], torch.ones(1, 4), ["x"])
    assert single[0, 0].item() == pytest.approx(0.3 / (1 + 1e-6))


def test_rloo_matches_loop():
    rewards, mask, scores = _outcome_batch(seed=1)
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, INDEX)
    groups = _groups(INDEX)
    expected = []
    for i, k in enumerate(INDEX):
        others = [scores[j] for j in groups[k] if j != i]
        expected.append(scores[i] - sum(others) / len(others) if others else scores[i])
    _check_broadcast(adv, mask, expected)


def test_opo_matches_loop():
    rewards, mask, scores = _outcome_batch(seed=2)
    adv, _ = compute_opo_outcome_advantage(rewards, mask, INDEX)
    groups = _groups(INDEX)
    lengths = mask.sum(-1).tolist()
    expected = []
    for i, k in enumerate(INDEX):
        members = groups[k]
        if len(members) == 1:
            baseline = 0.0
        else:
            baseline = sum(lengths[j] * scores[j] for j in members) / sum(lengths[j] for j in members)
        expected.append(scores[i] - baseline)
    _check_broadcast(adv, mask, expected)


def test_gpg_matches_loop():
    rewards, mask, scores = _outcome_batch(seed=3)
    scores[4] = 0.0  # one zero score: alpha = 6 / 5
    rewards[4] = 0.0
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, INDEX, f_norm=2.0)
    groups = _groups(INDEX)
    alpha = len(scores) / sum(1 for x in scores if x != 0)
    expected = []
    for i, k in enumerate(INDEX):
        members = groups[k]
        mean = sum(scores[j] for j in members) / len(members) if len(members) > 1 else 0.0
        expected.append(alpha * (scores[i] - mean) / 2.0)
    _check_broadcast(adv, mask, expected)


def test_gpg_pinned_and_all_zero_batch():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 3.0], [0.0, 0.0]])
    adv, _ = compute_gpg_outcome_advantage(rewards, torch.ones(4, 2), ["a", "a", "b", "b"])
    # alpha = 4 / 2; group a: mean 0.5 -> +-1.0; group b: mean 1.5 -> +-3.0
    assert adv[:, 0].tolist() == [1.0, -1.0, 3.0, -3.0]
    zero, _ = compute_gpg_outcome_advantage(torch.zeros(2, 2), torch.ones(2, 2), [1, 1])
    assert torch.isfinite(zero).all() and zero.abs().sum() == 0
    with pytest.raises(ValueError, match="f_norm"):
        compute_gpg_outcome_advantage(rewards, torch.ones(4, 2), [1, 1, 2, 2], f_norm=0.0)


def test_opo_group_of_empty_responses_has_no_nan():
    adv, _ = compute_opo_outcome_advantage(torch.zeros(2, 3), torch.zeros(2, 3), [1, 1])
    assert torch.isfinite(adv).all() and adv.abs().sum() == 0


def _gae_reference(rewards, values, mask, gamma, lam):
    bs, length = rewards.shape
    adv = [[0.0] * length for _ in range(bs)]
    for i in range(bs):
        next_v, last = 0.0, 0.0
        for t in reversed(range(length)):
            delta = rewards[i, t].item() + gamma * next_v - values[i, t].item()
            g = delta + gamma * lam * last
            if mask[i, t]:
                next_v, last = values[i, t].item(), g
            adv[i][t] = last
    returns = [[adv[i][t] + values[i, t].item() for t in range(length)] for i in range(bs)]
    flat = [adv[i][t] for i in range(bs) for t in range(length) if mask[i, t]]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)
    white = [
        [(adv[i][t] - mean) / math.sqrt(var + 1e-8) if mask[i, t] else 0.0 for t in range(length)]
        for i in range(bs)
    ]
    return white, returns


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.8)])
def test_gae_matches_loop_with_observation_tokens(gamma, lam):
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(3, 6, generator=g)
    values = torch.randn(3, 6, generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.float32)
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = _gae_reference(rewards, values, mask, gamma, lam)
    assert adv.tolist() == [pytest.approx(r, abs=1e-5) for r in ref_adv]
    assert ret.tolist() == [pytest.approx(r, abs=1e-5) for r in ref_ret]


def test_reinforce_plus_plus_matches_loop():
    g = torch.Generator().manual_seed(4)
    rewards = torch.randn(3, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.9)
    ref_ret = [[0.0] * 4 for _ in range(3)]
    for i in range(3):
        running = 0.0
        for t in reversed(range(4)):
            running = rewards[i, t].item() + 0.9 * running
            ref_ret[i][t] = running
            running *= mask[i, t].item()
    assert ret.tolist() == [pytest.approx(r, abs=1e-5) for r in ref_ret]
    flat = [ref_ret[i][t] for i in range(3) for t in range(4) if mask[i, t]]
    mean, std = statistics.mean(flat), statistics.stdev(flat)
    for i in range(3):
        for t in range(4):
            expected = (ref_ret[i][t] - mean) / math.sqrt(std**2 + 1e-8) if mask[i, t] else 0.0
            assert adv[i, t].item() == pytest.approx(expected, abs=1e-5)


def test_remax_matches_loop():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float32)
    baselines = torch.tensor([0.25, 2.0])
    adv, ret = compute_remax_outcome_advantage(rewards, baselines, mask)
    assert ret.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.5, 0.0]]
    assert adv.tolist() == [[0.75, 0.75, 0.75], [-1.0, -1.5, 0.0]]


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo"])
def test_group_estimators_zero_on_masked_and_empty_rows(name):
    rewards, mask, _ = _outcome_batch()
    mask[4] = 0
    rewards[4] = 0
    adv, _ = get_advantage_fn(name)(rewards, mask, INDEX)
    assert torch.isfinite(adv).all()
    assert (adv[mask == 0] == 0).all()


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo"])
def test_group_estimators_bf16(name):
    rewards, mask, _ = _outcome_batch()
    adv32, _ = get_advantage_fn(name)(rewards, mask, INDEX)
    adv16, _ = get_advantage_fn(name)(rewards.bfloat16(), mask.bfloat16(), INDEX)
    assert adv16.dtype == torch.bfloat16
    assert torch.allclose(adv16.float(), adv32, atol=3e-2, rtol=2e-2)


def test_gae_bf16_is_finite_and_close():
    g = torch.Generator().manual_seed(5)
    rewards, values = torch.randn(2, 8, generator=g), torch.randn(2, 8, generator=g)
    mask = torch.ones(2, 8)
    a32, _ = compute_gae_advantage_return(rewards, values, mask, 1.0, 0.95)
    a16, _ = compute_gae_advantage_return(rewards.bfloat16(), values.bfloat16(), mask.bfloat16(), 1.0, 0.95)
    assert torch.isfinite(a16.float()).all() and torch.allclose(a16.float(), a32, atol=0.1)


def test_index_length_checked():
    rewards, mask, _ = _outcome_batch()
    with pytest.raises(ValueError, match="index has 2 entries"):
        compute_grpo_outcome_advantage(rewards, mask, ["a", "b"])


def test_compute_advantage_dispatch_from_batch():
    rewards, mask, _ = _outcome_batch()
    batch = TrainBatch(response_mask=mask, token_level_rewards=rewards, uid=INDEX)
    out = compute_advantage(batch, "grpo", epsilon=1e-6)
    expected, _ = compute_grpo_outcome_advantage(rewards, mask, INDEX)
    assert torch.equal(out.advantages, expected) and out.returns is not None
    assert batch.advantages is None  # the input record is unchanged
    with pytest.raises(ValueError, match="unknown key 'gama'.*did you mean 'gamma'"):
        compute_advantage(batch, "reinforce_plus_plus", gama=0.9)
    with pytest.raises(ValueError, match="needs TrainBatch.values"):
        compute_advantage(batch, "gae")
    with pytest.raises(ValueError, match="unknown key 'index'"):
        compute_advantage(batch, "grpo", index=INDEX)
    values = torch.zeros_like(rewards)
    gae = compute_advantage(batch.replace(values=values), "ppo", gamma=1.0, lam=1.0)
    assert gae.returns is not None and torch.isfinite(gae.advantages).all()
