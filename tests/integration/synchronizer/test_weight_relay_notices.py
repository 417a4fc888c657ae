"""Version notices down the fan-out tree (tree/notices.py) over real `grpc.aio` servers on port 0: an
explorer asks its parent's relay whether the version its step needs is published, a relay asks up its
own chain once for all its children, so the synchronizer answers only the root's children; a dead
parent sends the child to the synchronizer, a hung one after its deadline; a parent with nothing new
yet is asked again; the end of the run travels down; a relay refuses a plan step; the heartbeat
carries the held version instead of a load report each step."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from rft.v1 import synchronizer_pb2

from services.common.config.sync_plan import SyncPlan
from services.synchronizer.members import MemberStatus
from services.weight_sync.tree.notices import WAIT, Notices, NoticeUnavailable, tree_wait
from services.weight_sync.tree.server import peer_channel, serve_relay


async def chain_of_three(sync_server, sync_clients):
    """fanout 1: e0 under the synchronizer, e1 under e0, e2 under e1; each with a relay and a TreeWait
    that asked the synchronizer for step 1 (so each knows its chain)."""
    core, address = await sync_server(method="memory", fanout=1)
    trainer = await sync_clients(address, "trainer", "trainer")
    clients, trees = [], []
    for i in range(3):
        client = await sync_clients(address, f"e{i}", "explorer", register=False)
        client.relay = await serve_relay(client.channel, f"e{i}", timeout_s=10)  # closed with the client
        await client.register()
        tree = tree_wait(client, SyncPlan())
        assert tree is not None
        first = await tree.wait(1, 0, 10)  # step 1 needs version 0: answered at once
        assert first.model_version.version == 0 and not first.timed_out
        clients.append(client)
        trees.append(tree)
    relays = [c.relay.address for c in clients]
    assert [t.chain for t in trees] == [(), (relays[0],), (relays[1], relays[0])]
    return core, trainer, clients, trees


def waits_at_synchronizer(core, version: int) -> set[str]:
    return {e.member_id for e in core.history if e.kind == "wait" and e.version == version}


async def test_notices_go_down_the_tree_and_the_synchronizer_answers_only_the_root_child(
    sync_server, sync_clients
):
    core, trainer, clients, trees = await chain_of_three(sync_server, sync_clients)
    # step 2 needs version 1 (fixed plan, interval 1): all three wait before the trainer publishes it
    waits = [asyncio.ensure_future(t.wait(2, 0, 10)) for t in trees]
    await core.wait_until(lambda: core.members["e0"].status == MemberStatus.REQUIRE_SYNC, 10)
    await trainer.push_weights({}, version=1)
    answers = await asyncio.gather(*waits)
    assert [a.model_version.version for a in answers] == [1, 1, 1]
    assert [a.required_version for a in answers] == [1, 1, 1] and not any(a.timed_out for a in answers)
    assert [tuple(a.weight_sources) for a in answers] == [t.chain for t in trees]  # for the fetch
    assert [(t.via_parent, t.via_synchronizer) for t in trees] == [(0, 2), (1, 1), (1, 1)]
    # e1's relay asked its own parent, e0's relay asked the synchronizer, once each
    notices = [c.relay.node.notices for c in clients]
    assert [n.upstream_waits for n in notices] == [1, 1, 0]
    assert waits_at_synchronizer(core, 1) == {"e0"}
    # a version already seen is answered by the parent at once, with no wait upstream
    again = await trees[2].wait(2, 1, 10)
    assert again.model_version.version == 1 and [n.upstream_waits for n in notices] == [1, 1, 0]


async def test_the_end_of_the_run_travels_down_the_tree(sync_server, sync_clients):
    core, _, clients, trees = await chain_of_three(sync_server, sync_clients)
    wait = asyncio.ensure_future(trees[2].wait(2, 0, 10))  # via e1's relay, then e0's, then the synchronizer
    await core.wait_until(lambda: core.members["e0"].status == MemberStatus.REQUIRE_SYNC, 10)
    await core.shutdown()
    answer = await wait
    assert answer.finished and trees[2].via_parent == 1


async def test_a_dead_parent_sends_the_child_to_the_synchronizer(sync_server, sync_clients):
    core, trainer, clients, trees = await chain_of_three(sync_server, sync_clients)
    await clients[1].relay.handle.stop(0)  # e1's relay is gone (its explorer still registered)
    await trainer.push_weights({}, version=1)
    answer = await trees[2].wait(2, 0, 10)
    assert answer.model_version.version == 1
    assert (trees[2].via_parent, trees[2].via_synchronizer) == (0, 2)
    # the synchronizer named the chain again; the next wait tries the parent again and falls back again
    assert trees[2].chain == (clients[1].relay.address, clients[0].relay.address)
    assert (await trees[2].wait(2, 1, 10)).model_version.version == 1


async def test_a_relay_answers_min_version_only_and_names_the_field(sync_server, sync_clients):
    _, address = await sync_server(method="memory", fanout=1)
    client = await sync_clients(address, "e0", "explorer", register=False)
    client.relay = await serve_relay(client.channel, "e0", timeout_s=10)
    channel = peer_channel(client.relay.address, timeout_s=10)
    try:
        wait = channel.unary_unary(
            WAIT,
            request_serializer=synchronizer_pb2.WaitForVersionRequest.SerializeToString,
            response_deserializer=synchronizer_pb2.WaitForVersionResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await wait(synchronizer_pb2.WaitForVersionRequest(member_id="x", step=3), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "step" in err.value.details()
    finally:
        await channel.close()


async def test_a_relay_with_no_source_answering_says_so():
    dead = peer_channel("127.0.0.1:1", timeout_s=5)
    try:
        notices = Notices("e9", lambda address: dead, lambda: ("127.0.0.1:1",))
        with pytest.raises(NoticeUnavailable, match="UNAVAILABLE"):
            await notices.answer(1, 5)
        assert notices.upstream_waits == 1
    finally:
        await dead.close()


async def test_the_heartbeat_carries_the_held_version(sync_server, sync_clients):
    core, address = await sync_server(method="memory", fanout=1)
    client = await sync_clients(address, "e0", "explorer")
    client.model_version, client.step = 3, 5
    await client.heartbeat()
    member = core.members["e0"]
    assert (member.model_version, member.step) == (3, 5)


async def test_no_tree_wait_without_a_relay_or_when_the_plan_never_waits(sync_server, sync_clients):
    _, address = await sync_server(method="memory", fanout=1)
    client = await sync_clients(address, "e0", "explorer", register=False)
    assert tree_wait(client, SyncPlan()) is None  # no relay: every wait goes to the synchronizer
    client.relay = await serve_relay(client.channel, "e0", timeout_s=10)
    assert tree_wait(client, SyncPlan(style="trainer_driven")) is None
    assert tree_wait(client, SyncPlan(style="explorer_driven")) is not None


async def test_a_hung_parent_is_given_up_on_and_a_slow_one_is_asked_again(sync_server, sync_clients):
    core, trainer, clients, trees = await chain_of_three(sync_server, sync_clients)
    release = asyncio.Event()

    async def hang(request, context):  # a parent that accepts the call and never answers (SIGSTOPped)
        await release.wait()
        return synchronizer_pb2.WaitForVersionResponse()

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        hang,
        request_deserializer=synchronizer_pb2.WaitForVersionRequest.FromString,
        response_serializer=synchronizer_pb2.WaitForVersionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("rft.v1.SynchronizerService", {"WaitForVersion": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        child = trees[1]
        child.ask_s = child.slack_s = 0.3
        child.chain = (f"127.0.0.1:{port}",)
        await trainer.push_weights({}, version=1)
        t0 = time.monotonic()
        answer = await child.wait(2, 0, 20)  # given up on after ask_s + slack_s, then the synchronizer
        assert time.monotonic() - t0 < 5  # not the 20 s window
        assert answer.model_version.version == 1 and child.via_synchronizer == 2 and child.via_parent == 0
        assert child.chain == (clients[0].relay.address,)  # the synchronizer named the real parent again
        # a parent that is alive but has nothing yet answers timed_out each ask_s and is asked again
        grandchild = trees[2]
        grandchild.ask_s = 0.2
        wait = asyncio.ensure_future(grandchild.wait(3, 1, 20))
        await core.wait_until(lambda: core.members["e0"].status == MemberStatus.REQUIRE_SYNC, 10)
        await asyncio.wait({wait}, timeout=0.5)  # a few asks go by with nothing published
        assert not wait.done()
        await trainer.push_weights({}, version=2)
        answer = await wait
        assert answer.model_version.version == 2 and not answer.timed_out
        assert (grandchild.via_parent, grandchild.via_synchronizer) == (1, 1)
    finally:
        release.set()
        await server.stop(0)
