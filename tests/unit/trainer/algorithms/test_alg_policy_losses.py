"""Policy losses against per-token loop references, gradients and stop-gradients, configs."""

import math

import pytest
import torch

from services.trainer.algorithms import (
    compute_policy_loss,
    get_policy_loss_fn,
)


def _inputs(seed=0, bs=4, length=5, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, length, generator=g) * 2
    new = old + (torch.rand(bs, length, generator=g) - 0.5) * 2 * spread
    adv = torch.randn(bs, length, generator=g)
    mask = torch.ones(bs, length)
    mask[1, 3:] = 0
    mask[3, 1:] = 0
    return old, new, adv, mask


def _ppo_token(old, new, a, low, high, c):
    r = math.exp(max(min(new - old, 20.0), -20.0))
    l1, l2 = -a * r, -a * min(max(r, 1 - low), 1 + high)
    lc = max(l1, l2)
    loss = min(lc, -a * c) if a < 0 else lc
    return loss, l2 > l1, (lc > -a * c) and a < 0


def _loop_ppo(old, new, adv, mask, low, high, c):
    total, n, clipped, lower, kl = 0.0, 0, 0, 0, 0.0
    for i in range(old.shape[0]):
        for t in range(old.shape[1]):
            if not mask[i, t]:
                continue
            loss, cl, lo = _ppo_token(old[i, t].item(), new[i, t].item(), adv[i, t].item(), low, high, c)
            total += loss
            clipped += cl
            lower += lo
            kl += old[i, t].item() - new[i, t].item()
            n += 1
    return total / n, clipped / n, kl / n, lower / n


@pytest.mark.parametrize("low,high", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.3)])
def test_vanilla_matches_loop_and_legacy_api(low, high):
    old, new, adv, mask = _inputs(spread=0.6)
    loss, metrics = get_policy_loss_fn("vanilla")(
        old, new, adv, mask, "token-mean", {"clip_ratio_low": low, "clip_ratio_high": high}
    )
    ref = _loop_ppo(old, new, adv, mask, low, high, 3.0)
    assert loss.item() == pytest.approx(ref[0], rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(ref[1])
    assert metrics["actor/ppo_kl"] == pytest.approx(ref[2], rel=1e-5)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(ref[3])
    legacy = compute_policy_loss(old, new, adv, mask, cliprange=0.2, cliprange_low=low, cliprange_high=high)
    assert legacy[0].item() == pytest.approx(loss.item())
    assert [legacy[1].item(), legacy[2].item(), legacy[3].item()] == pytest.approx(list(ref[1:]), rel=1e-5)


def test_dual_clip_bounds_negative_advantage_loss():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(10.0), math.log(0.5)]])  # ratios 10 and 0.5
    adv = torch.tensor([[-1.0, 1.0]])
    loss, clipfrac, _, lower = compute_policy_loss(
        old, new, adv, torch.ones(1, 2), cliprange=0.2, clip_ratio_c=3.0
    )
    # token 0: max(10, 1.2) = 10 -> dual clip min(10, 3) = 3; token 1: max(-0.5, -0.8) = -0.5
    assert loss.item() == pytest.approx((3.0 - 0.5) / 2)
    assert lower.item() == pytest.approx(0.5)
    assert clipfrac.item() == 0.0  # neither token has L2 > L1: the unclipped term is the larger one


def test_vanilla_pinned():
    old, new, adv, mask = _inputs(seed=7)
    loss, metrics = get_policy_loss_fn("ppo")(old, new, adv, mask, "token-mean", None)
    assert loss.item() == pytest.approx(0.038774, abs=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 7)
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.159843, abs=1e-5)


def test_vanilla_gradient_zero_for_clipped_tokens():
    old = torch.zeros(1, 3)
    new = torch.tensor([[math.log(1.5), math.log(1.1), math.log(0.5)]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0]])
    loss, _ = get_policy_loss_fn("vanilla")(old, new, adv, torch.ones(1, 3), "token-mean", None)
    loss.backward()
    # token 0 clipped above (A > 0): no gradient; token 1 inside: -A r / 3; token 2 below: -A r / 3
    assert new.grad.tolist()[0] == pytest.approx([0.0, -1.1 / 3, -0.5 / 3], rel=1e-5)


def test_rollout_is_weights_multiply_the_token_loss():
    old, new, adv, mask = _inputs()
    weights = torch.rand(old.shape, generator=torch.Generator().manual_seed(3))
    fn = get_policy_loss_fn("vanilla")
    base, _ = fn(old, new, adv, mask, "seq-mean-token-sum", None)
    weighted, _ = fn(old, new, adv, mask, "seq-mean-token-sum", None, rollout_is_weights=weights)
    ones, _ = fn(old, new, adv, mask, "seq-mean-token-sum", None, rollout_is_weights=torch.ones_like(weights))
    assert ones.item() == pytest.approx(base.item())
    assert weighted.item() != pytest.approx(base.item())


def test_gspo_value_and_gradient_use_sequence_ratio():
    old, new, adv, mask = _inputs(seed=1, spread=0.0005)
    new = new.clone().requires_grad_(True)
    seq_adv = adv[:, :1].expand_as(adv).contiguous()  # GSPO advantages are per sequence
    loss, metrics = get_policy_loss_fn("gspo")(old, new, seq_adv, mask, "token-mean", None)
    loss.backward()
    bs = old.shape[0]
    total = 0.0
    for i in range(bs):
        toks = [t for t in range(old.shape[1]) if mask[i, t]]
        s = math.exp(sum(new[i, t].item() - old[i, t].item() for t in toks) / len(toks))
        a = seq_adv[i, 0].item()
        clipped = min(max(s, 1 - 3e-4), 1 + 4e-4)
        total += max(-a * s, -a * clipped)  # same for every token, so the token mean is this
        unclipped = -a * s >= -a * clipped
        for t in range(old.shape[1]):
            # d/d log pi_t of sg(s) * exp(lp - sg(lp)) is s; seq-mean-token-mean divides by |y| and bs
            expected = (-a * s / len(toks) / bs) if (mask[i, t] and unclipped) else 0.0
            assert new.grad[i, t].item() == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert loss.item() == pytest.approx(total / bs, rel=1e-5)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_gspo_ignores_token_order_within_a_sequence():
    old, new, adv, mask = _inputs(seed=2, spread=0.0003)
    seq_adv = adv[:, :1].expand_as(adv).contiguous()
    fn = get_policy_loss_fn("gspo")
    a, _ = fn(old, new, seq_adv, torch.ones_like(mask), "token-mean", None)
    perm = torch.tensor([4, 2, 0, 1, 3])
    b, _ = fn(old[:, perm], new[:, perm], seq_adv, torch.ones_like(mask), "token-mean", None)
    assert a.item() == pytest.approx(b.item(), rel=1e-6)


def test_cispo_loss_and_stop_gradient():
    old, new, adv, mask = _inputs(seed=3, spread=0.8)
    new = new.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn("cispo")(old, new, adv, mask, "token-mean", {"clip_ratio_high": 0.28})
    loss.backward()
    n = mask.sum().item()
    total, clipped = 0.0, 0
    for i in range(old.shape[0]):
        for t in range(old.shape[1]):
            r = math.exp(new[i, t].item() - old[i, t].item())
            w = min(max(r, 0.0), 1.28)
            if mask[i, t]:
                total += -w * adv[i, t].item() * new[i, t].item()
                clipped += w != r
            expected_grad = -w * adv[i, t].item() / n if mask[i, t] else 0.0
            assert new.grad[i, t].item() == pytest.approx(expected_grad, rel=1e-4, abs=1e-7)
    assert loss.item() == pytest.approx(total / n, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipped / n)
    assert clipped > 0  # some ratios above 1.28 still get gradient (unlike PPO)


def test_sapo_matches_gate_formula_and_on_policy_gradient():
    old, new, adv, mask = _inputs(seed=4, spread=0.5)
    loss, metrics = get_policy_loss_fn("sapo")(old, new, adv, mask, "token-mean", None)
    seq_losses = []
    for i in range(old.shape[0]):
        vals = []
        for t in range(old.shape[1]):
            if mask[i, t]:
                r = math.exp(new[i, t].item() - old[i, t].item())
                a = adv[i, t].item()
                tau = 1.0 if a > 0 else 1.05
                vals.append(-(1 / (1 + math.exp(-tau * (r - 1)))) * 4 / tau * a)
        seq_losses.append(sum(vals) / len(vals))
    assert loss.item() == pytest.approx(sum(seq_losses) / len(seq_losses), rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == 0.0
    lp = old.clone().requires_grad_(True)  # on-policy: ratio 1 -> gate slope 1 -> PPO gradient
    sapo, _ = get_policy_loss_fn("sapo")(old, lp, adv, torch.ones_like(mask), "token-mean", None)
    sapo.backward()
    lp2 = old.clone().requires_grad_(True)
    ppo, _ = get_policy_loss_fn("ppo")(old, lp2, adv, torch.ones_like(mask), "seq-mean-token-mean", None)
    ppo.backward()
    assert torch.allclose(lp.grad, lp2.grad, atol=1e-6)


def test_gpg_and_sft():
    old, new, adv, mask = _inputs(seed=5)
    gpg, m = get_policy_loss_fn("gpg")(old, new, adv, mask, "token-mean", None)
    assert m == {}
    assert gpg.item() == pytest.approx((-(new * adv) * mask).sum().item() / mask.sum().item(), rel=1e-5)
    sft, m = get_policy_loss_fn("sft")(None, new, None, mask, "seq-mean-token-sum", None)
    per_seq = [-(new[i] * mask[i]).sum().item() for i in range(4)]
    assert sft.item() == pytest.approx(sum(per_seq) / 4, rel=1e-5)
    assert m["actor/sft_loss"] == pytest.approx(sft.item())


def test_dpo_matches_reference_and_learns_preference():
    g = torch.Generator().manual_seed(6)
    logp = -torch.rand(4, 3, generator=g)
    ref = -torch.rand(4, 3, generator=g)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    logp.requires_grad_(True)
    loss, m = get_policy_loss_fn("dpo")(ref, logp, None, mask, "token-mean", {"beta": 0.5})
    losses, acc = [], 0
    for pair in range(2):
        w, lo = 2 * pair, 2 * pair + 1
        dw = sum((logp[w, t].item() - ref[w, t].item()) for t in range(3) if mask[w, t])
        dl = sum((logp[lo, t].item() - ref[lo, t].item()) for t in range(3) if mask[lo, t])
        losses.append(math.log1p(math.exp(-0.5 * (dw - dl))))
        acc += dw > dl
    assert loss.item() == pytest.approx(sum(losses) / 2, rel=1e-5)
    assert m["actor/accuracy_mean"] == pytest.approx(acc / 2)
    loss.backward()
    assert (logp.grad[0::2][mask[0::2] == 1] < 0).all()  # descending raises chosen log-probs
    assert (logp.grad[1::2][mask[1::2] == 1] > 0).all()
    with pytest.raises(ValueError, match="pairs"):
        get_policy_loss_fn("dpo")(ref[:3], logp[:3], None, mask[:3], "token-mean", None)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "sapo", "gpg", "sft"])
def test_empty_mask_no_nan_and_masked_garbage_ignored(name):
    old, new, adv, mask = _inputs(seed=8)
    fn = get_policy_loss_fn(name)
    empty, metrics = fn(old, new, adv, torch.zeros_like(mask), "token-mean", None)
    assert empty.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())
    clean, _ = fn(old, new, adv, mask, "token-mean", None)
    dirty_new = torch.where(mask.bool(), new, torch.full_like(new, 50.0))
    dirty_adv = torch.where(mask.bool(), adv, torch.full_like(adv, 1e6))
    dirty, _ = fn(old, dirty_new, dirty_adv, mask, "token-mean", None)
    assert dirty.item() == pytest.approx(clean.item(), rel=1e-5)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "sapo", "gpg", "sft", "dpo"])
def test_bf16_inputs(name):
    old, new, adv, mask = _inputs(seed=9)
    fn = get_policy_loss_fn(name)
    ref, _ = fn(old, new, adv, mask, "token-mean", None)
    new16 = new.bfloat16().requires_grad_(True)
    out, metrics = fn(old.bfloat16(), new16, adv.bfloat16(), mask.bfloat16(), "token-mean", None)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(new16.grad.float()).all()
    assert out.item() == pytest.approx(ref.item(), abs=5e-2)


def test_config_errors():
    old, new, adv, mask = _inputs()
    with pytest.raises(ValueError, match="unknown key 'tau'"):
        get_policy_loss_fn("sapo")(old, new, adv, mask, "token-mean", {"tau": 1.0})
    with pytest.raises(ValueError, match="loss_agg_mode"):
        get_policy_loss_fn("vanilla")(old, new, adv, mask, "mean", None)
    with pytest.raises(ValueError, match="cliprange"):
        compute_policy_loss(old, new, adv, mask)
    assert get_policy_loss_fn("gspo").config_cls.from_dict({"clip_range_high": 1e-3}).clip_ratio_high == 1e-3
