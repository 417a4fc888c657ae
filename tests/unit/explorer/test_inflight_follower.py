"""The explorer's in-flight follower (services/explorer/inflight.py): it runs the follow loop with the
explorer's version and sync_interval (held + sync_interval), fetches and reports each one offered,
skips what it holds, stops at the run's end (the loop's error handling: tests/unit/weight_sync/member/
test_follow.py); the shared fetch loads one version at a time and never twice; the step metrics; and
engines that cannot take weights mid-generation are refused by name."""

from __future__ import annotations

import asyncio

import pytest

from services.common.experience import Experience
from services.explorer.inflight import InflightFollower, enable_inflight, inflight_metrics, serialised
from services.weight_sync.method import sync_method
from tests.support.follow_client import FollowClient, answer


async def test_the_follower_fetches_each_new_version_and_stops_when_the_run_ends():
    held = [0]
    fetched: list[int] = []

    async def fetch(offer):
        fetched.append(offer.model_version.version)
        held[0] = offer.model_version.version
        return held[0]

    client = FollowClient(
        [answer(2), answer(0, timed_out=True), answer(2), answer(4), answer(4, finished=True)]
    )
    follower = InflightFollower(client, fetch, sync_method("memory"), lambda: held[0], interval=2)
    follower.start()
    await asyncio.wait_for(follower._task, 10)  # it returns at `finished`
    assert fetched == [2, 4]  # the second offer of 2 is already held: no fetch
    assert client.reports == [(2, True), (4, True)]
    assert client.asked == [2, 4, 4, 4, 6]  # held + sync_interval each time
    assert follower.loads == 2 and not follower.running


async def test_stop_cancels_the_wait():
    client = FollowClient([])
    follower = InflightFollower(client, None, sync_method("memory"), lambda: 0)
    follower.start()
    await asyncio.sleep(0)  # ok-sleep: the follower starts waiting
    assert follower.running
    await follower.stop()
    assert not follower.running


async def test_the_shared_fetch_loads_one_version_at_a_time_and_never_twice():
    held = [0]
    calls: list[int] = []
    release = asyncio.Event()

    async def fetch(offer):
        calls.append(offer.model_version.version)
        await release.wait()
        held[0] = offer.model_version.version
        return held[0]

    shared = serialised(fetch, lambda: held[0])
    first = asyncio.create_task(shared(answer(3)))
    second = asyncio.create_task(shared(answer(3)))  # the gate and the follower, same offer
    await asyncio.sleep(0)  # ok-sleep: both are queued on the lock
    release.set()
    assert await asyncio.gather(first, second) == [3, 3]
    assert calls == [3]


def test_step_metrics_count_mixed_responses():
    exps = [
        Experience(tokens=[1, 2, 3, 4], prompt_length=1, token_model_versions=[0, 0, 1]),
        Experience(tokens=[1, 2, 3], prompt_length=1, token_model_versions=[1, 1]),
    ]
    m = inflight_metrics(exps, updates=1.0)
    assert m == {
        "rollout/inflight_updates": 1.0,
        "rollout/inflight_mixed_fraction": 0.5,
        "rollout/inflight_versions_mean": 1.5,
    }


def test_an_engine_without_in_flight_loads_is_refused():
    class Plain:
        name = "plug-in"

    with pytest.raises(ValueError, match="'plug-in' cannot take weights mid-generation"):
        enable_inflight([Plain()])
