"""Rollout importance-sampling correction: weights and rejection against a per-element reference,
pinned numbers on seeded tensors, the loss weighting, the batch stage and config errors."""

import math

import pytest
import torch

from services.trainer.algorithms import (
    RolloutISConfig,
    TrainBatch,
    agg_loss,
    apply_rollout_correction,
    compute_rollout_importance_weights,
    get_policy_loss_fn,
)

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)


def _log_probs():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=g) * 2
    rollout = old + torch.randn(3, 4, generator=g) * 0.8
    return old, rollout


def _cfg(**kw):
    return RolloutISConfig(rollout_is=True, rollout_is_threshold=2.0, **kw)


def _reference(old, rollout, level, mode, upper, lower, veto=None):
    """Per-sequence, per-token loops of the formulas in the module docstring."""
    weights, keep = torch.zeros_like(old), torch.zeros_like(old)
    for i in range(old.shape[0]):
        idx = [t for t in range(old.shape[1]) if MASK[i, t]]
        logs = [float(old[i, t] - rollout[i, t]) for t in idx]
        seq = {"sequence": sum(logs), "geometric": sum(logs) / len(logs)}.get(level)
        vetoed = veto is not None and any(x < math.log(veto) for x in logs)
        for t, x in zip(idx, logs, strict=True):
            w = math.exp(x if seq is None else seq)
            inside = lower <= w <= upper
            weights[i, t] = min(w, upper) if mode == "truncate" else w
            keep[i, t] = 0.0 if vetoed or (mode == "mask" and not inside) else 1.0
    return weights, keep


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_weights_and_mask_match_the_per_token_reference(level, mode):
    old, rollout = _log_probs()
    weights, mask, _ = compute_rollout_importance_weights(
        old, rollout, MASK, _cfg(rollout_is_level=level, rollout_is_mode=mode, rollout_is_veto_threshold=0.5)
    )
    ref_w, ref_keep = _reference(old, rollout, level, mode, 2.0, 0.5, veto=0.5)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)
    assert torch.equal(mask, ref_keep)


def test_pinned_token_truncate_numbers():
    old, rollout = _log_probs()
    weights, mask, m = compute_rollout_importance_weights(old, rollout, MASK, _cfg())
    expected = torch.tensor(
        [[0.7242, 0.5115, 1.7779, 0.0], [1.6117, 0.8645, 1.9844, 0.4146], [2.0, 0.9065, 0.0, 0.0]]
    )
    torch.testing.assert_close(weights, expected, atol=1e-4, rtol=0)
    assert torch.equal(mask, MASK)  # truncation never rejects
    pinned = {
        "mismatch/rollout_is_mean": 1.239028,
        "mismatch/rollout_is_std": 0.663103,
        "mismatch/rollout_is_min": 0.414582,
        "mismatch/rollout_is_max": 2.355964,  # before truncation
        "mismatch/rollout_is_eff_sample_size": 0.798144,
        "mismatch/rollout_is_ratio_fraction_high": 1 / 9,
        "mismatch/rollout_is_ratio_fraction_low": 1 / 9,
        "mismatch/rollout_is_masked_fraction": 0.0,
        "mismatch/rollout_is_veto_fraction": 0.0,
        "mismatch/mismatch_kl": -0.05307,
        "mismatch/mismatch_k3_kl": 0.185958,
    }
    assert m == pytest.approx(pinned, abs=1e-5)


def test_pinned_sequence_geometric_mask_and_veto_numbers():
    old, rollout = _log_probs()
    w, _, m = compute_rollout_importance_weights(old, rollout, MASK, _cfg(rollout_is_level="sequence"))
    assert w[:, 0].tolist() == pytest.approx([0.658565, 1.146296, 2.0], abs=1e-5)
    assert m["mismatch/rollout_is_max"] == pytest.approx(2.135688, abs=1e-5)
    w, _, m = compute_rollout_importance_weights(old, rollout, MASK, _cfg(rollout_is_level="geometric"))
    assert w[:, 0].tolist() == pytest.approx([0.870027, 1.034723, 1.461399], abs=1e-5)
    _, mask, m = compute_rollout_importance_weights(old, rollout, MASK, _cfg(rollout_is_mode="mask"))
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [0, 1, 0, 0]]
    assert m["mismatch/rollout_is_masked_fraction"] == pytest.approx(2 / 9)
    _, mask, m = compute_rollout_importance_weights(old, rollout, MASK, _cfg(rollout_is_veto_threshold=0.5))
    assert mask[1].tolist() == [0, 0, 0, 0] and m["mismatch/rollout_is_veto_fraction"] == pytest.approx(1 / 3)


def test_weights_multiply_the_per_token_policy_loss():
    old, rollout = _log_probs()
    g = torch.Generator().manual_seed(1)
    log_prob = old + 0.1 * torch.randn(3, 4, generator=g)
    adv = torch.randn(3, 4, generator=g)
    weights, _, _ = compute_rollout_importance_weights(old, rollout, MASK, _cfg())
    loss_fn = get_policy_loss_fn("vanilla")
    plain, _ = loss_fn(old, log_prob, adv, MASK, "token-mean", None)
    weighted, _ = loss_fn(old, log_prob, adv, MASK, "token-mean", None, weights)
    ratio = torch.exp(log_prob - old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 3.0), per_token)
    torch.testing.assert_close(weighted, agg_loss(per_token * weights, MASK, "token-mean"))
    assert not torch.allclose(plain, weighted)


def test_batch_stage_off_metrics_only_and_applied():
    old, rollout = _log_probs()
    batch = TrainBatch(response_mask=MASK, old_log_probs=old, rollout_log_probs=rollout)
    same, metrics = apply_rollout_correction(batch, RolloutISConfig())
    assert same is batch and metrics == {}
    only, metrics = apply_rollout_correction(batch, RolloutISConfig(rollout_is_threshold=2.0))
    assert only is batch and "mismatch/rollout_is_mean" in metrics
    applied, _ = apply_rollout_correction(batch, _cfg(rollout_is_mode="mask"))
    assert applied.rollout_is_weights is not None and applied.response_mask.sum() == MASK.sum() - 2
    with pytest.raises(ValueError, match="no rollout log-probs"):
        apply_rollout_correction(batch.replace(rollout_log_probs=None), _cfg())


def test_config_errors_name_the_field():
    with pytest.raises(KeyError, match="rollout_is_level"):
        RolloutISConfig(rollout_is_level="tokens")
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        RolloutISConfig(rollout_is=True)
    with pytest.raises(ValueError, match="rollout_is_threshold_lower"):
        RolloutISConfig(rollout_is_threshold=2.0, rollout_is_threshold_lower=3.0)
    assert RolloutISConfig(rollout_is_threshold=4.0).lower == 0.25
