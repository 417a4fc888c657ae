"""The one follow loop (`services/weight_sync/member/follow.py`) under both of its callers' settings:
the in-flight follower's (errors reported, the loop goes on, no re-registering) and serve mode's (its
own count of the version held, re-register when forgotten, a fetch cut off by an away synchronizer
asked again, anything else raised)."""

from __future__ import annotations

import asyncio
import functools

import grpc
import pytest

from services.weight_sync import GroupBrokenError, StaleGenerationError
from services.weight_sync.member.away import synchronizer_away
from services.weight_sync.member.follow import follow_versions
from services.weight_sync.method import sync_method
from tests.support.follow_client import FollowClient, answer, rpc_error

C = grpc.StatusCode


class Fetch:
    """Each call takes the next outcome: a version it loads (it becomes `held`) or an error it raises."""

    def __init__(self, outcomes, held: int = 0):
        self.outcomes, self.held, self.offered = list(outcomes), held, []

    async def __call__(self, offer) -> int:
        self.offered.append(offer.model_version.version)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        self.held = outcome
        return outcome


def _serve_loop(client: FollowClient, fetch: Fetch, loaded: list[int]):
    """follow_versions as serve mode runs it (services/explorer/serve/endpoint.py `follow_run`)."""
    held = [client.model_version]

    def on_loaded(version: int) -> None:
        held[0] = max(held[0], version)
        loaded.append(version)

    return follow_versions(
        client, fetch, sync_method("memory"), lambda: held[0], timeout_s=1.0,
        on_away=functools.partial(synchronizer_away, register=client.register), errors="raise",
        on_loaded=on_loaded,
    )  # fmt: skip


async def test_reporting_follower_reports_every_failure_and_goes_on():
    fetch = Fetch([2, RuntimeError("no weights"), GroupBrokenError("a member died")])
    client = FollowClient(
        [rpc_error(C.INTERNAL), answer(2), answer(3), answer(3), answer(3, finished=True)], failing_reports=1
    )
    loaded: list[int] = []
    loop = follow_versions(
        client, fetch, sync_method("memory"), lambda: fetch.held, timeout_s=1.0, errors="report",
        on_loaded=loaded.append,
    )  # fmt: skip
    await asyncio.wait_for(loop, 10)
    assert client.asked == [1, 1, 3, 3, 3]  # a failed wait (any code) is asked again after a backoff
    assert loaded == [2] and fetch.offered == [2, 3, 3]
    # the report of 2 failed (only logged); both failed loads of 3 are reported with their error
    assert client.reports == [(2, True), (3, False), (3, False)]
    assert client.messages[1:] == ["RuntimeError: no weights", "GroupBrokenError: a member died"]
    assert client.registered == 0  # the in-flight follower leaves re-registering to the sync gate


async def test_serving_follower_counts_what_it_holds_registers_again_and_retries_an_away_fetch():
    fetch = Fetch([rpc_error(C.UNAVAILABLE), StaleGenerationError("group changed"), 3])
    client = FollowClient(
        [
            rpc_error(C.NOT_FOUND),  # the synchronizer restarted and forgot this member: register again
            rpc_error(C.UNAVAILABLE),  # still restarting: back off only
            answer(1),  # already held: not fetched
            answer(3),  # the pull is cut off (away): asked again, not reported
            answer(3),  # the group changed mid-sync: reported failed
            answer(3),
            answer(0, timed_out=True),
            answer(3, finished=True),
        ],
        model_version=1,
    )
    loaded: list[int] = []
    await asyncio.wait_for(_serve_loop(client, fetch, loaded), 10)
    assert client.asked == [2, 2, 2, 2, 2, 2, 4, 4]  # held + 1, held counted from the client's version
    assert client.registered == 1 and fetch.offered == [3, 3, 3] and loaded == [3]
    assert client.reports == [(3, False), (3, True)]


@pytest.mark.parametrize(
    "wait, fetched, failing_reports",
    [
        (rpc_error(C.INTERNAL), [], 0),  # a wait that fails for another reason than away
        (answer(2), [rpc_error(C.INTERNAL)], 0),
        (answer(2), [RuntimeError("engine died")], 0),
        (answer(2), [2], 1),  # the report of a load
    ],
    ids=["wait", "fetch-rpc", "fetch-other", "report"],
)
async def test_serving_follower_raises_what_is_not_away(wait, fetched, failing_reports):
    client = FollowClient([wait], failing_reports=failing_reports)
    with pytest.raises((grpc.aio.AioRpcError, RuntimeError)):
        await asyncio.wait_for(_serve_loop(client, Fetch(fetched), []), 10)
    assert client.registered == 0
