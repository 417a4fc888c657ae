"""DPO in the trainer on the tiny model: pair experiences become adjacent (chosen, rejected) rows that
every split keeps together, the reference model gives the reference log-probs, training raises the
chosen response's log-prob against the rejected one, and micro-batching leaves the gradient as it is."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.trainer.collate import collate
from services.trainer.distributed import DistInfo, ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.rowwise import MicroBatching, local_micro_batches
from services.trainer.settings import TrainerSettings
from tests.support.trainer_data import make_config, make_pairs

torch.set_num_threads(1)

DPO = {"algorithm_type": "dpo", "repeat_times": 1, "optimizer": {"lr": 2e-3, "weight_decay": 0.0}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def make_engine(model_dir, root, **sections) -> FSDPEngine:
    sections.setdefault("algorithm", DPO)
    settings = TrainerSettings.from_config(make_config(model_dir, root, **sections))
    return FSDPEngine(settings, ensure_process_group())


def seq_logps(engine: FSDPEngine, step) -> torch.Tensor:
    return (engine.worker.actor.compute_log_prob(step) * step.batch.response_mask).sum(-1)


def test_pairs_expand_to_adjacent_rows():
    exps = make_pairs(3)
    step = collate(exps)
    assert step.size == 6
    for i, e in enumerate(exps):
        assert torch.equal(step.tokens[2 * i], e.tokens)
        assert torch.equal(step.tokens[2 * i + 1], e.rejected_tokens)
    assert list(step.batch.uid) == ["pair0", "pair0", "pair1", "pair1", "pair2", "pair2"]
    assert step.batch.rollout_log_probs is None  # offline pairs were never sampled


@pytest.mark.parametrize(
    "how", [MicroBatching(1, None, 2), MicroBatching(3, None, 2), MicroBatching(8, 20, 2)]
)
def test_every_split_keeps_pairs_together(how):
    step = collate(make_pairs(8, seed=5))
    cpu = torch.device("cpu")
    seen = []
    for rank in range(2):
        info = DistInfo(rank=rank, world_size=2, local_rank=rank, backend="gloo", device=cpu)
        for rows in local_micro_batches(step, info, how):
            assert len(rows) % 2 == 0 and all(rows[k] % 2 == 0 and rows[k + 1] == rows[k] + 1
                                              for k in range(0, len(rows), 2)), rows  # fmt: skip
            seen += rows
    assert sorted(seen) == list(range(step.size))


def test_dpo_raises_the_chosen_margin_and_reports_trinity_metrics(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path, buffer={"batch_size": 4})
    assert engine.worker.ref is not None  # DPO loads the frozen reference even with kl_loss_fn: none
    assert engine.worker.settings.mini_batch_size == 8  # 4 pairs = 8 rows
    step = collate(make_pairs(4, seed=1))
    before = seq_logps(engine, step)
    first = engine.train_step(step)
    assert first["actor/dpo_loss"] == pytest.approx(0.693147, abs=1e-5)  # policy == reference: -log σ(0)
    assert first["actor/reward_margin"] == pytest.approx(0.0, abs=1e-6)
    for _ in range(4):
        last = engine.train_step(step)
    after = seq_logps(engine, step)
    margin_before = before[0::2] - before[1::2]
    margin_after = after[0::2] - after[1::2]
    assert (margin_after > margin_before + 0.5).all(), (margin_before, margin_after)
    assert last["actor/dpo_loss"] < 0.6 and last["actor/accuracy_mean"] == 1.0
    assert last["actor/chosen_reward"] > last["actor/rejected_reward"]
    assert last["actor/reward_margin"] == pytest.approx(
        last["actor/chosen_reward"] - last["actor/rejected_reward"]
    )
    # the reference stays the initial policy: its log-probs did not move
    ref = (engine.worker.ref.compute_log_prob(step) * step.batch.response_mask).sum(-1)
    torch.testing.assert_close(ref, before, atol=1e-5, rtol=0)


def test_dpo_micro_batches_give_the_one_big_batch_gradient(model_dir, tmp_path):
    pairs = make_pairs(4, seed=2)
    alg = DPO | {"kl_loss_fn": "k3"}  # the KL term is aggregated per sequence too
    big = make_engine(model_dir, tmp_path / "a", algorithm=alg, buffer={"batch_size": 4},
                      trainer={"micro_batch_size_per_gpu": 4})  # fmt: skip
    small = make_engine(model_dir, tmp_path / "b", algorithm=alg, buffer={"batch_size": 4},
                        trainer={"use_dynamic_bsz": True, "max_token_len_per_gpu": 20})  # fmt: skip
    assert len(local_micro_batches(collate(pairs), small.info, small.worker.actor.batching)) >= 3
    # both start from the same weights; the gradients stay on the parameters after the step
    m_big, m_small = big.train_step(collate(pairs)), small.train_step(collate(pairs))
    for (name, p_big), p_small in zip(big.worker.policy.named_parameters(), small.worker.policy.parameters(),
                                      strict=True):  # fmt: skip
        torch.testing.assert_close(p_small.grad, p_big.grad, atol=1e-5, rtol=0, msg=name)
    for key in ("actor/dpo_loss", "actor/pg_loss", "actor/chosen_reward", "actor/accuracy_mean"):
        assert m_small[key] == pytest.approx(m_big[key], abs=1e-5)


def test_single_rows_are_refused_with_a_hint(model_dir, tmp_path):
    engine = make_engine(model_dir, tmp_path, buffer={"batch_size": 2})
    single = [dataclasses.replace(e, rejected_tokens=None) for e in make_pairs(4)]
    with pytest.raises(ValueError, match="chosen_key and rejected_key"):
        engine.train_step(collate(single))
