"""The explorer's in-flight follower (services/explorer/inflight.py): it waits for the version after the
one held (held + sync_interval), fetches and reports each one offered, skips what it holds, stops at
the run's end; the shared fetch loads one version at a time and never twice; the step metrics; and
engines that cannot take weights mid-generation are refused by name."""

from __future__ import annotations

import asyncio

import pytest
from rft.v1 import common_pb2, synchronizer_pb2

from services.common.experience import Experience
from services.explorer.inflight import InflightFollower, enable_inflight, inflight_metrics, serialised
from services.weight_sync.method import sync_method


def _answer(version: int, *, finished: bool = False, timed_out: bool = False):
    return synchronizer_pb2.WaitForVersionResponse(
        model_version=common_pb2.ModelVersion(version=version), finished=finished, timed_out=timed_out
    )


class FakeClient:
    """Answers WaitForVersion from a queue; records the asks and the reports."""

    def __init__(self, answers):
        self.answers: asyncio.Queue = asyncio.Queue()
        for a in answers:
            self.answers.put_nowait(a)
        self.asked: list[int] = []
        self.reports: list[tuple[int, bool]] = []

    async def wait_for_version(self, step=0, min_version=0, timeout_s=None):
        self.asked.append(min_version)
        return await self.answers.get()

    async def report_load(self, version, ok=True, generation=0, message="", within_s=None):
        self.reports.append((version, ok))


async def test_the_follower_fetches_each_new_version_and_stops_when_the_run_ends():
    held = [0]
    fetched: list[int] = []

    async def fetch(answer):
        fetched.append(answer.model_version.version)
        held[0] = answer.model_version.version
        return held[0]

    client = FakeClient(
        [_answer(2), _answer(0, timed_out=True), _answer(2), _answer(4), _answer(4, finished=True)]
    )
    follower = InflightFollower(client, fetch, sync_method("memory"), lambda: held[0], interval=2)
    follower.start()
    await asyncio.wait_for(follower._task, 10)  # it returns at `finished`
    assert fetched == [2, 4]  # the second offer of 2 is already held: no fetch
    assert client.reports == [(2, True), (4, True)]
    assert client.asked == [2, 4, 4, 4, 6]  # held + sync_interval each time
    assert follower.loads == 2 and not follower.running


async def test_a_failed_fetch_is_reported_and_the_follower_goes_on():
    held = [0]

    async def fetch(answer):
        raise RuntimeError("no weights")

    client = FakeClient([_answer(1), _answer(1, finished=True)])
    follower = InflightFollower(client, fetch, sync_method("memory"), lambda: held[0])
    follower.start()
    await asyncio.wait_for(follower._task, 10)
    assert client.reports == [(1, False)]


async def test_stop_cancels_the_wait():
    client = FakeClient([])
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

    async def fetch(answer):
        calls.append(answer.model_version.version)
        await release.wait()
        held[0] = answer.model_version.version
        return held[0]

    shared = serialised(fetch, lambda: held[0])
    first = asyncio.create_task(shared(_answer(3)))
    second = asyncio.create_task(shared(_answer(3)))  # the gate and the follower, same offer
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
