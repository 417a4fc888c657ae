"""Property tests (hypothesis) for invariants of the estimators and losses."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.trainer.algorithms import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_grpo_outcome_advantage,
    compute_policy_loss,
    compute_rloo_outcome_advantage,
    kl_penalty,
)

FAST = settings(max_examples=60, deadline=None)
rewards_st = st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=1, max_size=12)


def _outcome(scores, length=3):
    t = torch.zeros(len(scores), length)
    t[:, -1] = torch.tensor(scores)
    return t, torch.ones(len(scores), length)


@FAST
@given(scores=rewards_st, n_groups=st.integers(1, 4), norm=st.booleans())
def test_grpo_group_advantages_sum_to_zero(scores, n_groups, norm):
    index = [i % n_groups for i in range(len(scores))]
    rewards, mask = _outcome(scores)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    per_sample = adv[:, 0]
    for g in set(index):
        members = [i for i, k in enumerate(index) if k == g]
        if len(members) > 1:
            assert abs(per_sample[members].sum().item()) < 1e-3 * len(members)
            if norm:  # normalised advantages are bounded by the group size
                assert per_sample[members].abs().max().item() <= len(members)
    assert torch.isfinite(adv).all()


@FAST
@given(scores=rewards_st, n_groups=st.integers(1, 4))
def test_rloo_group_advantages_sum_to_zero(scores, n_groups):
    index = [str(i % n_groups) for i in range(len(scores))]
    rewards, mask = _outcome(scores)
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    for g in set(index):
        members = [i for i, k in enumerate(index) if k == g]
        if len(members) > 1:
            assert abs(adv[members, 0].sum().item()) < 1e-3 * len(members)


@FAST
@given(
    seed=st.integers(0, 10_000),
    bs=st.integers(1, 5),
    length=st.integers(1, 6),
    spread=st.floats(0.0, 3.0),
    low=st.floats(0.0, 0.5),
    high=st.floats(0.0, 0.5),
    mode=st.sampled_from(LOSS_AGG_MODES),
)
def test_clipfracs_in_unit_interval_and_loss_finite(seed, bs, length, spread, low, high, mode):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, length, generator=g) * 3
    new = old + torch.randn(bs, length, generator=g) * spread
    adv = torch.randn(bs, length, generator=g)
    mask = (torch.rand(bs, length, generator=g) > 0.3).float()
    loss, clipfrac, ppo_kl, lower = compute_policy_loss(
        old, new, adv, mask, cliprange_low=low, cliprange_high=high, loss_agg_mode=mode
    )
    assert 0.0 <= clipfrac.item() <= 1.0 and 0.0 <= lower.item() <= 1.0
    assert torch.isfinite(loss) and torch.isfinite(ppo_kl)


@FAST
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(LOSS_AGG_MODES))
def test_agg_loss_of_constant_is_that_constant_for_mean_modes(seed, mode):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(3, 4, generator=g) > 0.5).float()
    mask[0, 0] = 1.0
    out = agg_loss(torch.full((3, 4), 2.5), mask, mode)
    if mode == "token-mean" or mode == "seq-mean-token-mean":
        assert abs(out.item() - 2.5) < 1e-5
    else:
        assert out.item() > 0


@FAST
@given(lp=st.floats(-30, 0, width=32), ref=st.floats(-30, 0, width=32))
def test_k3_and_k2_nonnegative(lp, ref):
    a, b = torch.tensor([[lp]]), torch.tensor([[ref]])
    assert kl_penalty(a, b, "k3").item() >= 0.0
    assert kl_penalty(a, b, "k2").item() >= 0.0
    assert kl_penalty(a, b, "k3+").item() == kl_penalty(a, b, "k3").item()
