"""The staleness bound of the trainer: which max_staleness a config resolves to (the `fully_async`
default included), the buffer dropping experiences older than it, and the `sample/staleness/*` and
`sample/dropped_stale*` metrics of each step."""

from __future__ import annotations

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.config import resolve
from services.trainer.core import TrainerCore
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from tests.support.trainer_data import OrderedBuffer, make_config, make_experiences

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize(
    ("synchronizer", "algorithm", "bound"),
    [
        ({"sync_style": "fully_async", "sync_interval": 1}, {}, 4),  # 4 publishes behind (AReaL)
        ({"sync_style": "fully_async", "sync_interval": 3}, {}, 12),
        (  # an explicit staleness_control wins
            {"sync_style": "fully_async", "sync_interval": 3},
            {"sample_strategy": "staleness_control", "sample_strategy_args": {"max_staleness": 2}},
            2,
        ),
        ({"sync_style": "trainer_driven"}, {}, None),  # no bound unless asked
        ({"sync_style": "fixed"}, {"sample_strategy": "staleness_control"}, 0),
    ],
)
def test_max_staleness_resolves(tmp_path, synchronizer, algorithm, bound):
    config = make_config(tmp_path, tmp_path, synchronizer=synchronizer, algorithm=algorithm)
    assert resolve(config).max_staleness == bound


def versioned(seed: int, version: int) -> list:
    exps = make_experiences(8, group_size=4, seed=seed)
    for e in exps:
        e.model_version = version
    return exps


async def test_stale_batches_are_dropped_and_staleness_is_logged(model_dir, tmp_path):
    # batch versions 0, 0, 0, 1: with max_staleness 1, step 3 (trainer version 2) needs >= 1, so the
    # third batch (version 0) is dropped and step 3 trains on the fourth
    buffer = OrderedBuffer([versioned(10, 0), versioned(11, 0), versioned(12, 0), versioned(13, 1)])
    config = make_config(model_dir, tmp_path, buffer={"batch_size": 2, "total_steps": 3})
    settings = TrainerSettings.from_config(config)
    core = TrainerCore(settings, FSDPEngine(settings, ensure_process_group()), buffer, max_staleness=1)
    await core.prepare()
    steps = [(await core.train_step(1000)).metrics for _ in range(3)]
    await core.shutdown()

    assert buffer.dropped == [2]
    assert [m["sample/staleness/mean"] for m in steps] == [0.0, 1.0, 1.0]
    assert [m["sample/staleness/max"] for m in steps] == [0.0, 1.0, 1.0]
    assert [m["sample/dropped_stale"] for m in steps] == [0.0, 0.0, 8.0]
    assert [m["sample/dropped_stale_total"] for m in steps] == [0.0, 0.0, 8.0]
    assert [m["sample/model_version/mean"] for m in steps] == [0.0, 0.0, 1.0]
