"""Per-token staleness (services/trainer/staleness.py): metrics over the model's tokens of experiences
whose tokens came from several versions, tokens older than the bound leave the action mask, a
trainer step logs them, and rollout importance weights compare each token with its own version."""

from __future__ import annotations

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.experience import Experience
from services.trainer.algorithms.rollout_correction import (
    RolloutISConfig,
    compute_rollout_importance_weights,
)
from services.trainer.core import TrainerCore
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from services.trainer.staleness import mask_stale_tokens, token_staleness_metrics
from tests.support.trainer_data import OrderedBuffer, make_config, make_experiences

torch.set_num_threads(1)


def _exp(versions: list[int] | None, model_version: int, mask: list[bool] | None = None) -> Experience:
    r = len(versions) if versions is not None else len(mask or [1, 1, 1])
    return Experience(
        tokens=list(range(2 + r)),
        prompt_length=2,
        model_version=model_version,
        token_model_versions=versions,
        action_mask=mask,
    )


def test_metrics_count_each_model_token_at_its_own_version():
    exps = [
        _exp([3, 3, 4, 4], 3),  # an update landed after two tokens
        _exp(None, 4, [True, True, True]),  # one version, no per-token record
        _exp([2, 2, 3, 5], 2, [True, False, True, True]),  # an observation token (masked out)
    ]
    m = token_staleness_metrics(exps, trainer_version=5)
    # staleness of the model tokens: 2,2,1,1 | 1,1,1 | 3,2,0
    expected = [2, 2, 1, 1, 1, 1, 1, 3, 2, 0]
    assert m["sample/token_staleness/mean"] == pytest.approx(sum(expected) / len(expected))
    assert m["sample/token_staleness/max"] == 3.0
    assert m["sample/mixed_version_fraction"] == pytest.approx(2 / 3)


def test_tokens_older_than_the_bound_leave_the_action_mask():
    exps = [_exp([1, 1, 2, 3], 1), _exp([2, 2, 2], 2), _exp(None, 0)]
    dropped = mask_stale_tokens(exps, min_version=2)
    assert dropped == 2
    assert exps[0].action_mask.tolist() == [False, False, True, True]
    assert exps[1].action_mask is None  # nothing stale: untouched
    assert exps[2].action_mask is None  # no per-token versions: the buffer's bound on model_version holds
    assert mask_stale_tokens(exps, min_version=0) == 0


def test_rollout_is_weights_use_each_tokens_own_version():
    # tokens 0-1 sampled by version v (log-prob -1.0), tokens 2-3 by v+1 (log-prob -2.0); the trainer's
    # old policy is v+1: the tokens of v+1 get weight 1 exactly, those of v get exp(old - rollout)
    old = torch.tensor([[-1.5, -1.5, -2.0, -2.0]])
    rollout = torch.tensor([[-1.0, -1.0, -2.0, -2.0]])
    mask = torch.ones(1, 4)
    config = RolloutISConfig(rollout_is=True, rollout_is_threshold=2.0)
    weights, _, _ = compute_rollout_importance_weights(old, rollout, mask, config)
    torch.testing.assert_close(weights[0, 2:], torch.ones(2))
    torch.testing.assert_close(weights[0, :2], torch.full((2,), float(torch.exp(torch.tensor(-0.5)))))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


async def test_a_trainer_step_logs_per_token_staleness(model_dir, tmp_path):
    batches = []
    for seed, mixed in ((20, False), (21, True)):  # all version 0; half of the second batch 0 then 1
        exps = make_experiences(8, group_size=4, seed=seed)
        for i, e in enumerate(exps):
            e.model_version = 0
            r = e.response_length
            if mixed and i % 2 == 0 and r > 1:  # an update to version 1 halfway through the response
                e.token_model_versions = torch.tensor([0] * (r // 2) + [1] * (r - r // 2))
        batches.append(exps)
    config = make_config(model_dir, tmp_path, buffer={"batch_size": 2, "total_steps": 2})
    settings = TrainerSettings.from_config(config)
    core = TrainerCore(settings, FSDPEngine(settings, ensure_process_group()), OrderedBuffer(batches))
    await core.prepare()
    steps = [(await core.train_step(1000)).metrics for _ in range(2)]
    await core.shutdown()

    assert steps[0]["sample/mixed_version_fraction"] == 0.0
    assert steps[0]["sample/token_staleness/mean"] == steps[0]["sample/token_staleness/max"] == 0.0
    # trainer version 1 at step 2: the tokens of version 1 are fresh (0), those of version 0 one behind
    assert steps[1]["sample/mixed_version_fraction"] == pytest.approx(0.5)
    assert steps[1]["sample/token_staleness/max"] == 1.0
    assert 0.0 < steps[1]["sample/token_staleness/mean"] < 1.0
    assert steps[1]["sample/staleness/mean"] == 1.0  # per experience: its model_version, the oldest
    assert all(m["sample/stale_tokens_masked"] == 0.0 for m in steps)
