"""KL estimators (incl. straight-through gradients), entropy, log-probs and the value loss."""

import math

import pytest
import torch

from services.trainer.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_entropy_from_logits,
    compute_kl_loss,
    compute_value_loss,
    entropy_from_logits_chunked,
    get_kl_fn,
    kl_penalty,
    kl_penalty_forward,
    logprobs_and_entropy,
    logprobs_from_logits,
)


def _logps(seed=0, shape=(3, 5)):
    g = torch.Generator().manual_seed(seed)
    return -torch.rand(shape, generator=g) * 3, -torch.rand(shape, generator=g) * 3


def _ref_kl(lp, ref, name):
    d = lp - ref
    if name in ("kl", "k1"):
        return d
    if name == "abs":
        return abs(d)
    if name in ("mse", "k2"):
        return 0.5 * d * d
    x = max(min(ref - lp, 20.0), -20.0)
    return max(min(math.exp(x) - x - 1, 10.0), -10.0)


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_estimators_match_scalar_formulas(name):
    lp, ref = _logps()
    out = kl_penalty(lp, ref, name)
    for a, b, o in zip(lp.flatten().tolist(), ref.flatten().tolist(), out.flatten().tolist(), strict=True):
        assert o == pytest.approx(_ref_kl(a, b, name), rel=1e-5, abs=1e-6)


def test_k3_pinned_and_clamped():
    lp = torch.tensor([[-1.0, -2.0, 0.0, -30.0]])
    ref = torch.tensor([[-2.0, -1.0, 0.0, 0.0]])
    out = kl_penalty(lp, ref, "k3")
    assert out.tolist()[0][:3] == pytest.approx([math.exp(-1) - (-1) - 1, math.exp(1) - 1 - 1, 0.0], rel=1e-6)
    assert out[0, 3].item() == 10.0  # exp(20) - 21 clamped to 10


@pytest.mark.parametrize(
    "name,base", [("k1+", "k1"), ("kl+", "kl"), ("k3+", "k3"), ("low_var_kl+", "k3"), ("abs+", "abs")]
)
def test_straight_through_value_of_named_estimator_gradient_of_k2(name, base):
    lp, ref = _logps(seed=1)
    lp = lp.clone().requires_grad_(True)
    out = kl_penalty(lp, ref, name)
    assert torch.allclose(out, kl_penalty(lp, ref, base))
    assert torch.allclose(out, kl_penalty_forward(lp, ref, name))
    out.sum().backward()
    assert torch.allclose(lp.grad, (lp - ref).detach())  # d/dlp of 0.5 (lp - ref)^2


def test_plain_k3_gradient_differs_from_straight_through():
    lp, ref = _logps(seed=2)
    lp = lp.clone().requires_grad_(True)
    kl_penalty(lp, ref, "k3").sum().backward()
    expected = 1 - torch.exp(ref - lp.detach())
    assert torch.allclose(lp.grad, expected, atol=1e-6)


def test_none_kl_is_zero_with_graph():
    lp, ref = _logps()
    lp.requires_grad_(True)
    out = get_kl_fn("none")(lp, ref)
    assert out.abs().sum().item() == 0.0
    out.sum().backward()
    assert lp.grad is not None


def test_apply_kl_penalty_and_kl_loss():
    lp, ref = _logps(seed=3)
    scores = torch.zeros(3, 5)
    scores[:, -1] = 1.0
    mask = torch.ones(3, 5)
    mask[2, 3:] = 0
    rewards, metrics = apply_kl_penalty(scores, lp, ref, mask, kl_coef=0.1, kl_penalty_type="kl")
    for i in range(3):
        row_kl = []
        for t in range(5):
            k = (lp[i, t] - ref[i, t]).item() if mask[i, t] else 0.0
            assert rewards[i, t].item() == pytest.approx(scores[i, t].item() - 0.1 * k, abs=1e-6)
            if mask[i, t]:
                row_kl.append(k)
    expected_kl = (
        sum(
            sum((lp[i, t] - ref[i, t]).item() for t in range(5) if mask[i, t]) / mask[i].sum().item()
            for i in range(3)
        )
        / 3
    )
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(expected_kl, rel=1e-5)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    loss, m = compute_kl_loss(lp, ref, mask, "low_var_kl", "token-mean")
    k3 = kl_penalty(lp, ref, "k3")
    assert loss.item() == pytest.approx((k3 * mask).sum().item() / mask.sum().item(), rel=1e-5)
    assert m["actor/kl_loss"] == pytest.approx(loss.item())


def test_kl_controllers():
    fixed = FixedKLController(0.001)
    fixed.update(5.0, 64)
    assert fixed.value == 0.001
    ctl = AdaptiveKLController(value=0.1, target_kl=0.1, horizon=100)
    ctl.update(current_kl=1.0, n_steps=10)  # error clipped to +0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    ctl.update(current_kl=0.05, n_steps=10)  # error -0.5 clipped to -0.2
    assert ctl.value == pytest.approx(0.1 * 1.02 * 0.98)


def test_entropy_matches_loop_reference_and_chunking():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 7, generator=g) * 2
    ent = compute_entropy_from_logits(logits)
    for i in range(2):
        for t in range(3):
            z = logits[i, t].tolist()
            mx = max(z)
            exps = [math.exp(v - mx) for v in z]
            total = sum(exps)
            expected = -sum((e / total) * math.log(e / total) for e in exps)
            assert ent[i, t].item() == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(entropy_from_logits_chunked(logits, chunk_size=2), ent, atol=1e-6)
    uniform = compute_entropy_from_logits(torch.zeros(1, 1, 16))
    assert uniform.item() == pytest.approx(math.log(16), rel=1e-6)
    bf = compute_entropy_from_logits(logits.bfloat16())
    assert bf.dtype == torch.float32 and torch.allclose(bf, ent, atol=5e-2)


def test_logprobs_from_logits():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 4, 9, generator=g)
    labels = torch.randint(0, 9, (2, 4), generator=g)
    out = logprobs_from_logits(logits, labels)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(out, expected, atol=1e-6)


def test_logprobs_and_entropy_share_one_logsumexp():
    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(5, 11, generator=g) * 3).requires_grad_()
    labels = torch.randint(0, 11, (5,), generator=g)
    lp, ent = logprobs_and_entropy(logits, labels)
    torch.testing.assert_close(lp, logprobs_from_logits(logits, labels), atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, compute_entropy_from_logits(logits), atol=1e-5, rtol=1e-5)
    assert lp.requires_grad and not ent.requires_grad  # entropy as a metric: no graph
    lp_g, ent_g = logprobs_and_entropy(logits, labels, entropy_grad=True)
    (grad,) = torch.autograd.grad(ent_g.sum(), logits)
    (expected,) = torch.autograd.grad(compute_entropy_from_logits(logits).sum(), logits)
    torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert not logprobs_and_entropy(logits, labels, entropy_grad=True)[1].requires_grad
    bf_lp, bf_ent = logprobs_and_entropy(logits.detach().bfloat16(), labels)
    assert bf_lp.dtype == bf_ent.dtype == torch.float32


def test_value_loss_matches_loop_reference():
    g = torch.Generator().manual_seed(6)
    vpreds, returns, values = (torch.randn(3, 4, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    losses, clipped, n = 0.0, 0, 0
    for i in range(3):
        for t in range(4):
            if not mask[i, t]:
                continue
            v, r, old = vpreds[i, t].item(), returns[i, t].item(), values[i, t].item()
            vc = min(max(v, old - 0.5), old + 0.5)
            losses += max((v - r) ** 2, (vc - r) ** 2)
            clipped += (vc - r) ** 2 > (v - r) ** 2
            n += 1
    assert loss.item() == pytest.approx(0.5 * losses / n, rel=1e-5)
    assert clipfrac.item() == pytest.approx(clipped / n)
    assert 0 < clipfrac.item() < 1


def test_value_loss_empty_mask():
    loss, frac = compute_value_loss(
        torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3), torch.zeros(2, 3)
    )
    assert loss.item() == 0.0 and frac.item() == 0.0
