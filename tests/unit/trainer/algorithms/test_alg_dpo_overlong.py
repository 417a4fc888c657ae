"""Pinned numbers for DPO (https://arxiv.org/abs/2305.18290) and DAPO's soft overlong punishment
(https://arxiv.org/abs/2503.14476) as the trainer runs them, checked against plain-Python formulas."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.algorithms import TrainBatch, get_policy_loss_fn, resolve_preset
from services.trainer.reward_stage import apply_reward_manager, make_reward_manager


def _seeded():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=g) * 2
    ref = -torch.rand(4, 5, generator=g) * 2
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float
    )
    return logp, ref, mask


def _reference_dpo(logp, ref, mask, beta, s):
    """-(1-s) log σ(βz) - s log σ(-βz), z = (π_c - ref_c) - (π_r - ref_r), sums over the mask."""
    rows = [sum(float(logp[i, t] - ref[i, t]) for t in range(5) if mask[i, t]) for i in range(4)]
    log_sigmoid = lambda x: -math.log1p(math.exp(-x))  # noqa: E731
    losses = []
    for c, r in ((rows[0], rows[1]), (rows[2], rows[3])):
        z = beta * (c - r)
        losses.append(-(1 - s) * log_sigmoid(z) - s * log_sigmoid(-z))
    return sum(losses) / 2, rows


@pytest.mark.parametrize(
    ("args", "pinned"), [({"beta": 0.1}, 0.5803993), ({"beta": 0.5, "label_smoothing": 0.1}, 0.3990115)]
)
def test_dpo_loss_pinned_and_matches_the_formula(args, pinned):
    logp, ref, mask = _seeded()
    loss, m = get_policy_loss_fn("dpo")(ref, logp, None, mask, "seq-mean-token-mean", args)
    expected, rows = _reference_dpo(logp, ref, mask, args["beta"], args.get("label_smoothing", 0.0))
    assert loss.item() == pytest.approx(pinned, abs=1e-6)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    beta = args["beta"]
    assert m["actor/chosen_reward"] == pytest.approx(beta * (rows[0] + rows[2]) / 2, abs=1e-6)
    assert m["actor/rejected_reward"] == pytest.approx(beta * (rows[1] + rows[3]) / 2, abs=1e-6)
    assert m["actor/reward_margin"] == pytest.approx(m["actor/chosen_reward"] - m["actor/rejected_reward"])
    assert m["actor/accuracy_mean"] == 1.0 and m["actor/dpo_loss"] == pytest.approx(loss.item())


def test_dpo_gradient_raises_chosen_lowers_rejected():
    logp, ref, mask = _seeded()
    logp.requires_grad_(True)
    loss, _ = get_policy_loss_fn("dpo")(ref, logp, None, mask, "seq-mean-token-mean", None)
    loss.backward()
    grad = logp.grad * mask
    assert (grad[0::2][mask[0::2].bool()] < 0).all() and (grad[1::2][mask[1::2].bool()] > 0).all()


def test_dpo_preset_reads_the_reference_in_pairs_and_refuses_token_mean():
    preset = resolve_preset("dpo", {"kl_loss_fn": "none"})
    assert preset.reads_reference and preset.pairwise and preset.advantage_fn is None
    assert preset.policy_loss_fn_args["beta"] == 0.1 and preset.loss_agg_mode == "seq-mean-token-mean"
    with pytest.raises(ValueError, match="loss_agg_mode must be one of"):
        resolve_preset("dpo", {"loss_agg_mode": "token-mean"})
    assert not resolve_preset("grpo").reads_reference and not resolve_preset("grpo").pairwise


def _scored(lengths: list[int], width: int = 10, score: float = 1.0) -> TrainBatch:
    mask = torch.zeros(len(lengths), width)
    scores = torch.zeros(len(lengths), width)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        if n:
            scores[i, n - 1] = score
    return TrainBatch(response_mask=mask, token_level_scores=scores, token_level_rewards=scores)


class _Tok:
    eos_token = None

    def decode(self, ids, skip_special_tokens=True):
        return ""


def test_overlong_penalty_pinned_on_the_explorer_scores():
    # L_max 8, L_cache 4: 0 up to 4 tokens, then -1/4 per token, -1 at 8 and beyond
    preset = resolve_preset(
        "dapo", {"reward_manager_args": {"overlong_buffer": {"len": 4, "penalty_factor": 1.0}}}
    )
    manager = make_reward_manager(preset, _Tok(), max_response_tokens=8)
    batch = _scored([2, 4, 5, 6, 8, 10, 0])
    shaped, metrics = apply_reward_manager(batch, manager)
    per_row = shaped.token_level_scores.sum(-1).tolist()
    assert per_row == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.0, 0.0, 0.0])
    assert shaped.token_level_scores[2, 4] == pytest.approx(0.75)  # at the last valid token
    assert torch.equal(shaped.token_level_rewards, shaped.token_level_scores)
    # the preset's enable: true is kept under the partial override; the empty row gets no penalty
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(-(0.25 + 0.5 + 1.0 + 1.0) / 7)
    assert metrics["reward/overlong_ratio"] == pytest.approx(4 / 7)


def test_naive_manager_leaves_scores_and_dapo_needs_room_for_its_buffer():
    naive = make_reward_manager(resolve_preset("grpo"), _Tok(), max_response_tokens=8)
    batch = _scored([2, 9])
    shaped, metrics = apply_reward_manager(batch, naive)
    assert torch.equal(shaped.token_level_scores, batch.token_level_scores) and metrics == {}
    with pytest.raises(ValueError, match=r"algorithm.reward_manager_args.*overlong_buffer.len"):
        make_reward_manager(resolve_preset("dapo"), _Tok(), max_response_tokens=1024)  # preset len 4096
    explicit = resolve_preset("grpo", {"reward_manager": "dapo",
                                       "reward_manager_args": {"overlong_buffer": {"enable": True, "len": 2}}})  # fmt: skip
    shaped, metrics = apply_reward_manager(_scored([4]), make_reward_manager(explicit, _Tok(), 4))
    assert (
        shaped.token_level_scores.sum().item() == pytest.approx(0.0) and metrics["reward/overlong_ratio"] == 1
    )
