"""Policy and critic updates on the tiny model (world size 1: the plain module on CPU, the same
actor/critic code as FSDP2; one test forces the one-rank FSDP2 wrapping and compares).

Gradients are compared rather than weights: Adam's first step is ~lr·sign(g), which turns
1e-8 differences of near-zero gradients into lr-sized weight differences.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from launcher.tiny_model import make_tiny_model
from services.trainer.collate import collate
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from tests.support.trainer_data import make_config, make_experiences

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def make_engine(model_dir, root, fsdp: bool | None = None, **sections) -> FSDPEngine:
    settings = TrainerSettings.from_config(make_config(model_dir, root, **sections))
    return FSDPEngine(settings, ensure_process_group(), fsdp=fsdp)


def grads(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in engine.worker.policy.named_parameters():
        g = p.grad
        out[name] = (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
    return out


def response_logprob_sums(engine: FSDPEngine, step) -> torch.Tensor:
    lp = engine.worker.actor.compute_log_prob(step)
    return (lp * step.batch.response_mask).sum(-1)


def test_positive_advantages_raise_logprobs_negative_lower(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path, algorithm={"optimizer": {"lr": 2e-3, "weight_decay": 0.0}})
    exps = make_experiences(8, group_size=4, seed=1)
    for i, e in enumerate(exps):
        e.reward = float(i % 2)  # each group: two winners, two losers -> GRPO advantages +/-
    step = collate(exps)
    before = response_logprob_sums(engine, step)
    metrics = engine.train_step(step)
    after = response_logprob_sums(engine, step)
    delta = after - before
    winners = torch.tensor([e.reward > 0 for e in exps])
    assert (delta[winners] > 0).all(), delta
    assert (delta[~winners] < 0).all(), delta
    for key in (
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
    ):
        assert key in metrics
    assert metrics["actor/lr"] == pytest.approx(2e-3)
    # every parameter got its gradient (FSDP2 regression: a no-grad pass must not hide them)
    assert metrics["actor/grad_norm"] > 0
    assert all(p.grad is not None for g in engine.worker.actor.optimizer.param_groups for p in g["params"])
    assert metrics["perf/throughput"] > 0 and "critic/advantages/mean" in metrics


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_four_micro_batches_equal_one_big_batch(model_dir, tmp_path, loss_agg_mode):
    exps = make_experiences(8, group_size=4, seed=2)
    alg = {"loss_agg_mode": loss_agg_mode, "kl_loss_fn": "k3", "entropy_loss_fn_args": {"entropy_coef": 0.01}}
    big = make_engine(model_dir, tmp_path / "a", algorithm=alg, trainer={"micro_batch_size_per_gpu": 8})
    small = make_engine(model_dir, tmp_path / "b", algorithm=alg, trainer={"micro_batch_size_per_gpu": 2})
    m_big, m_small = big.train_step(collate(exps)), small.train_step(collate(exps))
    g_big, g_small = grads(big), grads(small)
    for name in g_big:
        torch.testing.assert_close(g_small[name], g_big[name], atol=1e-5, rtol=0)
    assert m_small["actor/pg_loss"] == pytest.approx(m_big["actor/pg_loss"], abs=1e-5)
    assert m_small["actor/grad_norm"] == pytest.approx(m_big["actor/grad_norm"], rel=1e-5)


def test_dynamic_batching_equals_fixed_batching(model_dir, tmp_path):
    exps = make_experiences(8, group_size=4, seed=3)
    fixed = make_engine(model_dir, tmp_path / "f", trainer={"micro_batch_size_per_gpu": 8})
    dynamic = make_engine(
        model_dir, tmp_path / "d", trainer={"use_dynamic_bsz": True, "max_token_len_per_gpu": 30}
    )
    step = collate(exps)
    plan = dynamic.worker.actor.batching
    from services.trainer.rowwise import local_micro_batches

    assert len(local_micro_batches(step, dynamic.info, plan)) >= 3  # really split by tokens
    m_fixed, m_dyn = fixed.train_step(step), dynamic.train_step(step)
    g_fixed, g_dyn = grads(fixed), grads(dynamic)
    for name in g_fixed:
        torch.testing.assert_close(g_dyn[name], g_fixed[name], atol=1e-5, rtol=0)
    assert m_dyn["actor/pg_loss"] == pytest.approx(m_fixed["actor/pg_loss"], abs=1e-5)


def test_ppo_critic_reduces_value_loss_on_a_fixed_batch(model_dir, tmp_path):
    engine = make_engine(
        model_dir,
        tmp_path,
        algorithm={"algorithm_type": "ppo", "repeat_times": 1, "kl_loss_fn": "none"},
        buffer={"batch_size": 8},
        trainer={"trainer_config": {"critic": {"optim": {"lr": 1e-4}}}},
    )
    assert engine.worker.critic is not None and engine.worker.ref is None
    step = collate(make_experiences(8, group_size=1, seed=4))
    losses = [engine.train_step(step)["critic/vf_loss"] for _ in range(6)]
    assert losses[-1] < 0.5 * losses[0], losses
    metrics = engine.train_step(step)
    for key in (
        "critic/vf_clipfrac",
        "critic/vpred_mean",
        "critic/grad_norm",
        "critic/values/mean",
        "critic/lr",
    ):
        assert key in metrics
    assert metrics["critic/lr"] == pytest.approx(1e-4)


def test_kl_in_reward_uses_reference_and_reports_penalty(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path, algorithm={"kl_penalty_fn": "kl", "kl_loss_fn": "none"})
    assert engine.worker.ref is not None
    step = collate(make_experiences(8, seed=5))
    engine.train_step(step)
    metrics = engine.train_step(step)  # the policy moved: KL(old || ref) > 0 now
    assert metrics["actor/reward_kl_penalty"] != 0.0
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.001)


def test_non_finite_grad_norm_skips_the_step(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path)
    step = collate(make_experiences(8, seed=6))
    before = {k: v.clone() for k, v in engine.iter_state_dict()}
    bad = step.with_batch(step.batch.replace(token_level_scores=step.batch.token_level_scores * float("nan")))
    metrics = engine.train_step(bad)
    assert metrics["actor/skipped_updates"] == 1.0
    after = dict(engine.iter_state_dict())
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_one_rank_fsdp2_step_equals_plain_module_step(model_dir, tmp_path):
    """The wrapping is the only difference between one CPU process and FSDP2 (`fsdp.uses_fsdp`)."""
    exps = make_experiences(8, group_size=4, seed=7)
    alg = {"kl_loss_fn": "k3", "entropy_loss_fn_args": {"entropy_coef": 0.01}}
    plain = make_engine(model_dir, tmp_path / "p", algorithm=alg, trainer={"micro_batch_size_per_gpu": 2})
    sharded = make_engine(
        model_dir, tmp_path / "s", fsdp=True, algorithm=alg, trainer={"micro_batch_size_per_gpu": 2}
    )
    assert not plain.worker.fsdp and sharded.worker.fsdp
    assert not any(isinstance(p, DTensor) for p in plain.worker.policy.parameters())
    assert all(isinstance(p, DTensor) for p in sharded.worker.policy.parameters())
    m_plain, m_sharded = plain.train_step(collate(exps)), sharded.train_step(collate(exps))
    g_plain, g_sharded = grads(plain), grads(sharded)
    for name in g_plain:
        torch.testing.assert_close(g_sharded[name], g_plain[name], atol=1e-6, rtol=0)
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert m_sharded[key] == pytest.approx(m_plain[key], rel=1e-5, abs=1e-7), key
    w_plain, w_sharded = dict(plain.iter_state_dict()), dict(sharded.iter_state_dict())
    assert w_plain.keys() == w_sharded.keys()


def test_one_update_per_batch_takes_old_log_probs_from_the_update_pass(model_dir, tmp_path):
    """One epoch, one mini-batch, no reward KL: no separate old-log-prob pass, and the gradient is the
    one a recomputed old policy gives (ratio 1 either way)."""
    exps = make_experiences(8, group_size=4, seed=8)
    derived = make_engine(model_dir, tmp_path / "d")
    recomputed = make_engine(model_dir, tmp_path / "r")
    assert not derived.worker.settings.recompute_old_log_probs
    step = collate(exps)
    old = recomputed.worker.actor.compute_log_prob(step)
    m_derived = derived.train_step(step)
    m_recomputed = recomputed.train_step(step.with_batch(step.batch.replace(old_log_probs=old)))
    assert "timing_s/old_log_prob" not in m_derived
    g_derived, g_recomputed = grads(derived), grads(recomputed)
    for name in g_derived:
        torch.testing.assert_close(g_derived[name], g_recomputed[name], atol=1e-6, rtol=0)
    assert m_derived["actor/ppo_kl"] == 0.0 and m_derived["actor/pg_clipfrac"] == 0.0
    assert m_derived["actor/pg_loss"] == pytest.approx(m_recomputed["actor/pg_loss"], abs=1e-6)


@pytest.mark.parametrize(
    ("sections", "recompute"),
    [
        ({"algorithm": {"ppo_epochs": 2}}, True),
        ({"algorithm": {"kl_penalty_fn": "kl", "kl_loss_fn": "none"}}, True),
        ({}, False),
    ],
)
def test_old_log_prob_pass_runs_when_a_batch_gets_several_updates(model_dir, tmp_path, sections, recompute):
    engine = make_engine(model_dir, tmp_path, **sections)
    assert engine.worker.settings.recompute_old_log_probs is recompute
    metrics = engine.train_step(collate(make_experiences(8, seed=9)))
    assert ("timing_s/old_log_prob" in metrics) is recompute


def test_rollout_probs_diff_compares_the_rollout_with_the_trainer(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path)
    exps = make_experiences(8, group_size=4, seed=10)
    step = collate(exps)
    true_lp = engine.worker.actor.compute_log_prob(step)
    for i, e in enumerate(exps):
        e.logprobs = true_lp[i, : e.response_length].clone()
    same = engine.train_step(collate(exps))
    assert same["training/rollout_probs_diff_max"] < 1e-5

    engine = make_engine(model_dir, tmp_path / "b")
    for e in exps:  # a rollout model that is sure of every token it sampled
        e.logprobs = torch.zeros(e.response_length)
    stale = engine.train_step(collate(exps))
    p = true_lp.exp()[step.batch.response_mask.bool()]
    assert stale["training/rollout_probs_diff_mean"] == pytest.approx(float((1 - p).mean()), rel=1e-4)
    assert stale["training/rollout_probs_diff_max"] == pytest.approx(float((1 - p).max()), rel=1e-4)
