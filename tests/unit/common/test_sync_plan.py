"""The sync policy (`services/common/config/sync_plan.py`): the plan's rules pinned as tables (Trinity-RFT's
cadence; docs/architecture.md), and what each service asks of it, per style x offset."""

from __future__ import annotations

import pytest

from services.common.config import load_config, resolve
from services.common.config.sync_plan import SyncPlan


@pytest.mark.parametrize(
    ("interval", "offset", "required"),
    [
        (1, 0, [0, 1, 2, 3, 4, 5]),  # step s runs on the weights of trainer step s - 1
        (1, 1, [0, 0, 1, 2, 3, 4]),  # one-step pipeline
        (2, 0, [0, 0, 2, 2, 4, 4]),
        (2, 1, [0, 0, 0, 2, 2, 4]),
    ],
)
def test_synchronizer_plan_fixed_explorer_requirement(interval, offset, required):
    plan = SyncPlan("fixed", interval, offset)
    assert [plan.explorer_required_version(s, held=0, last_sync_step=0) for s in range(1, 7)] == required


def test_synchronizer_plan_fixed_matches_trinity_sync_points():
    """Trinity: the explorer syncs after step s when s > K and (s - K) % I == 0, taking the newest
    version; the requirement rises exactly at those points, by I (the trainer publishes every I)."""
    for interval in (1, 2, 3):
        for offset in (0, 1, 2):
            plan = SyncPlan("fixed", interval, offset)
            for s in range(1, 20):
                rises = plan.explorer_required_version(s + 1, 0, 0) > plan.explorer_required_version(s, 0, 0)
                assert rises == (s > offset and (s - offset) % interval == 0), (interval, offset, s)


def test_synchronizer_plan_trainer_publishes():
    fixed2 = SyncPlan("fixed", 2, 0)
    assert [fixed2.trainer_should_publish(t, 0, False) for t in range(1, 6)] == [
        False,
        True,
        False,
        True,
        False,
    ]
    assert fixed2.trainer_should_publish(4, 4, False) is False  # already published this step
    driven = SyncPlan("trainer_driven", 3, 0)
    assert [driven.trainer_should_publish(t, 1, False) for t in range(2, 6)] == [False, False, True, True]
    by_explorer = SyncPlan("explorer_driven", 2, 0)
    assert by_explorer.trainer_should_publish(7, 0, False) is False
    assert by_explorer.trainer_should_publish(7, 0, True) is True
    assert fixed2.trainer_should_publish(3, 2, True) is True  # a waiting explorer is always served


def test_synchronizer_plan_dynamic_explorer_requirements():
    by_explorer = SyncPlan("explorer_driven", 2, 0)
    # 2 steps since the last sync at step 3 -> needs anything newer than what it holds
    assert by_explorer.explorer_required_version(5, held=4, last_sync_step=3) == 0
    assert by_explorer.explorer_required_version(6, held=4, last_sync_step=3) == 5
    assert SyncPlan("trainer_driven", 1, 0).explorer_required_version(9, held=0, last_sync_step=0) == 0


def test_synchronizer_plan_rejects_bad_settings():
    with pytest.raises(ValueError, match="sync_style"):
        SyncPlan("sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sync_interval"):
        SyncPlan("fixed", 0, 0)


def test_synchronizer_plan_fully_async_explorer_never_waits():
    """fully_async: whatever the step, the version held or the offset, an explorer needs nothing."""
    for interval in (1, 2, 5):
        for offset in (0, 1, 3):
            plan = SyncPlan("fully_async", interval, offset)
            assert {
                plan.explorer_required_version(s, held, last)
                for s in range(1, 30)
                for held in (0, 3, 17)
                for last in (0, s - 1)
            } == {0}, (interval, offset)


def test_synchronizer_plan_fully_async_trainer_publishes_every_interval():
    every = SyncPlan("fully_async", 1, 0)
    assert [every.trainer_should_publish(t, t - 1, False) for t in range(1, 6)] == [True] * 5
    three = SyncPlan("fully_async", 3, 0)
    # published after step 1: the next publish is due 3 steps later, then again 3 after that
    assert [three.trainer_should_publish(t, 1, False) for t in range(2, 6)] == [False, False, True, True]
    assert three.trainer_should_publish(4, 4, False) is False  # already published this step
    # trainer-side only: a run of 10 steps publishes after 3, 6, 9 (not on a fixed grid after a
    # late publish, as trainer_driven)
    last, published = 0, []
    for t in range(1, 11):
        if three.trainer_should_publish(t, last, False):
            last = t
            published.append(t)
    assert published == [3, 6, 9]


# style -> (explorer_waits, pipelined at offset 0, pipelined at offset >= 1, explores until the run ends)
POLICY = {
    "fixed": (True, False, True, False),
    "explorer_driven": (True, False, False, False),
    "trainer_driven": (False, False, False, False),
    "fully_async": (False, True, True, True),
}


@pytest.mark.parametrize("style", sorted(POLICY))
@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("interval", [1, 2])
def test_policy_answers_per_style_and_offset(style, offset, interval):
    waits, pipelined_at_0, pipelined_ahead, until_end = POLICY[style]
    plan = SyncPlan(style, interval, offset)
    pipelined = pipelined_ahead if offset else pipelined_at_0
    assert plan.explorer_waits() is waits
    assert plan.pipelined() is pipelined
    assert plan.pipeline_every() == (interval if pipelined else 0)
    assert plan.explores_until_run_ends() is until_end
    # a style that never waits needs no version at any step
    if not waits:
        assert {plan.explorer_required_version(s, 2, 0) for s in range(1, 9)} == {0}


@pytest.mark.parametrize("style", sorted(POLICY))
@pytest.mark.parametrize("offset", [0, 2])
def test_default_staleness_per_style(style, offset):
    assert SyncPlan(style, 3, offset).default_staleness() == (12 if style == "fully_async" else None)
    # a configured bound (staleness_control) wins in every style, 0 included
    assert SyncPlan(style, 3, offset, staleness=5).default_staleness() == 5
    assert SyncPlan(style, 3, offset, staleness=0).default_staleness() == 0


@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        ("synchronizer: {sync_style: fixed, sync_interval: 2, sync_offset: 1}", SyncPlan("fixed", 2, 1)),
        ("synchronizer: {sync_style: dynamic_by_trainer}", SyncPlan("trainer_driven", 1, 0)),
        ("synchronizer: {sync_style: fully_async, sync_interval: 2}", SyncPlan("fully_async", 2, 0)),
        (
            "algorithm: {sample_strategy: staleness_control, sample_strategy_args: {max_staleness: 3}}\n"
            "synchronizer: {sync_style: fully_async}",
            SyncPlan("fully_async", 1, 0, staleness=3),
        ),
    ],
)
def test_plan_from_config_and_the_resolved_bound(yaml, expected):
    config = load_config(text=yaml)
    plan = SyncPlan.from_config(config)
    assert plan == expected
    assert resolve(config).sync_plan == plan
    assert resolve(config).max_staleness == plan.default_staleness()


@pytest.mark.parametrize(
    "synchronizer",
    ["{sync_style: fully_async}", "{sync_style: fixed}"],
)
def test_offline_rows_have_no_staleness_bound(synchronizer):
    """A train stage reading a file (the quickstart's SFT warm-up) keeps every row whatever the style:
    under fully_async's default bound of 4 its version-0 rows were all dropped from trainer step 5 on,
    and the trainer waited for data forever (seen on an H200 with the quickstart run fully_async)."""
    base = (
        "mode: train\nalgorithm: {algorithm_type: sft, sample_strategy: staleness_control,"
        " sample_strategy_args: {max_staleness: 2}}\n"
        f"synchronizer: {synchronizer}\n"
    )
    offline = load_config(text=base + "buffer: {trainer_input: {experience_buffer: {path: rows.jsonl}}}")
    assert SyncPlan.from_config(offline).offline
    assert resolve(offline).max_staleness is None
    fed = load_config(text=base)  # train mode fed by explorers elsewhere: the bound holds
    assert not SyncPlan.from_config(fed).offline
    assert resolve(fed).max_staleness == 2
