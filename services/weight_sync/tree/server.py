"""gRPC side of the relay (`store.py`): a peer serves `PullWeights` (and version notices), and pulls from peers.

A relay answers `/rft.v1.SynchronizerService/PullWeights` - the synchronizer's own method, request and
stream - so anything that pulls from the synchronizer (`SyncClient`, a client in another language)
pulls from a peer unchanged by pointing at the peer's address. Besides it, a relay answers only
`WaitForVersion` for its children (`min_version` only: version notices, notices.py). The chunks
go out as the bytes it received (a pass-through serializer, as the synchronizer's servicer does).
`PullWeightsRequest.version` 0 = the newest version it holds or is receiving; a version it has not
begun yet is waited for (`wait_s`); one it does not hold answers NOT_FOUND; a stream whose sources all
failed ends with UNAVAILABLE. A stream that is a delta (store.py "Deltas") is served only to a puller
whose `have_version` is its base; any other puller gets NOT_FOUND before the first chunk and goes on
along its chain. A full payload is served to every puller (it handles one whatever it asked for).

`PeerSources` opens those streams: one channel per peer address (the synchronizer's own channel for
`fanout.ROOT`; peers through `peer_channel`, one retry), calls that fail at once when a peer is down
(`wait_for_ready=False`: the chain goes on to the next source instead of waiting for a dead parent),
and `chain(addresses)` in the form `relay.pull_version` takes. `RelayNode` is one member's relay (its
store, its registration, `fetch(version, chain)`); `serve_relay` starts one on its own port beside a
member's service (`ServedRelay`: the node, its server and the address peers dial). The relay's
refusals are its error types mapped to status codes once, in `ERRORS` (services/common/rpc/errors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc
from rft.v1 import synchronizer_pb2

from services.common.rpc import ServerHandle, create_channel, start_server
from services.common.rpc.errors import ErrorMap, Rule
from services.weight_sync.tree.notices import Notices, NoticeUnavailable
from services.weight_sync.tree.plan import ROOT
from services.weight_sync.tree.store import (
    RelayBroken,
    RelayStore,
    Source,
    VersionNotHeld,
    VersionStream,
    pull_version,
)

SERVICE_NAME = "rft.v1.SynchronizerService"
PULL = f"/{SERVICE_NAME}/PullWeights"


class NoticesOff(Exception):
    """This relay was started without version notices: it does not answer `WaitForVersion`."""


class StepNotAnswered(ValueError):
    """A `WaitForVersion` by step: a relay answers `min_version` only (the explorer applies the plan)."""


class DeltaBaseMismatch(LookupError):
    """The relay holds the version as a delta from a base the puller does not hold."""


ERRORS = ErrorMap(  # services/common/rpc/errors.py, docs/conventions.md
    Rule(NoticesOff, grpc.StatusCode.UNIMPLEMENTED),
    Rule(StepNotAnswered, grpc.StatusCode.INVALID_ARGUMENT, names_field=True),
    Rule((VersionNotHeld, DeltaBaseMismatch), grpc.StatusCode.NOT_FOUND),
    Rule(
        NoticeUnavailable, grpc.StatusCode.UNAVAILABLE, lambda e: f"no source answered the relay: {e}"[:1000]
    ),
    Rule(RelayBroken, grpc.StatusCode.UNAVAILABLE, lambda e: f"relay lost the version: {e}"[:1000]),
)


class RelayServicer:
    """`PullWeights` over a `RelayStore`, and `WaitForVersion` from the relay's `Notices` (version
    notices down the tree, `notices.py`; without them the relay does not answer it)."""

    def __init__(
        self,
        store: RelayStore,
        wait_s: float = 30.0,
        on_miss: Callable[[int], None] | None = None,
        notices: Notices | None = None,
    ):
        self.store, self.wait_s, self.on_miss, self.notices = store, wait_s, on_miss, notices

    async def WaitForVersion(self, request: synchronizer_pb2.WaitForVersionRequest, context):
        return await ERRORS.guard(context, lambda: self._wait(request))

    async def _wait(
        self, request: synchronizer_pb2.WaitForVersionRequest
    ) -> synchronizer_pb2.WaitForVersionResponse:
        if self.notices is None:
            raise NoticesOff("this relay does not answer WaitForVersion")
        if request.step:
            raise StepNotAnswered(
                f"step: a relay answers min_version only (the explorer applies the sync plan), got step {request.step}"
            )
        timeout = request.timeout_ms / 1000 if request.timeout_ms > 0 else self.wait_s
        return await self.notices.answer(request.min_version, timeout)

    async def PullWeights(
        self, request: synchronizer_pb2.PullWeightsRequest, context
    ) -> AsyncIterator[bytes]:
        async with contextlib.aclosing(ERRORS.guard_stream(context, self._pull(request))) as stream:
            async for raw in stream:
                yield raw

    async def _pull(self, request: synchronizer_pb2.PullWeightsRequest) -> AsyncIterator[bytes]:
        if request.version and self.on_miss is not None:
            self.on_miss(request.version)  # a version this relay has not begun: it may pull it through
        stream = await self.store.stream_for(request.version, self.wait_s)
        have = request.have_version if request.HasField("have_version") else None
        first = True
        async for raw in stream.follow():
            if first and stream.base is not None and stream.base != have:
                raise DeltaBaseMismatch(
                    f"this relay holds version {stream.version} as a delta from version "
                    f"{stream.base}; the puller holds {have}"
                )
            first = False
            yield raw


def _identity(data: bytes) -> bytes:
    return data


def add_to_server(servicer: RelayServicer, server: grpc.aio.Server) -> None:
    handlers = {
        "PullWeights": grpc.unary_stream_rpc_method_handler(
            servicer.PullWeights,
            request_deserializer=synchronizer_pb2.PullWeightsRequest.FromString,
            response_serializer=_identity,
        ),
        "WaitForVersion": grpc.unary_unary_rpc_method_handler(
            servicer.WaitForVersion,
            request_deserializer=synchronizer_pb2.WaitForVersionRequest.FromString,
            response_serializer=synchronizer_pb2.WaitForVersionResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def registration(
    store: RelayStore,
    wait_s: float = 30.0,
    on_miss: Callable[[int], None] | None = None,
    notices: Notices | None = None,
) -> tuple:
    """The (add_fn, servicer, name) triple `start_server` takes."""
    return (add_to_server, RelayServicer(store, wait_s, on_miss, notices), SERVICE_NAME)


def peer_channel(address: str, **kw) -> grpc.aio.Channel:
    """A channel to a peer relay: `create_channel` (auth, TLS as given) with one retry only, so a
    peer that is down fails a pull in ~0.1 s (the default 5 attempts take ~1.5 s) and the chain goes on."""
    return create_channel(address, retries=2, **kw)


class PeerSources:
    """Pull streams from the synchronizer (`ROOT`) and from peers by address, one channel each."""

    def __init__(
        self,
        synchronizer: grpc.aio.Channel,
        connect: Callable[[str], grpc.aio.Channel] = peer_channel,
        member_id: str = "",
        timeout_s: float = 3600.0,
    ):
        self.member_id, self.timeout_s = member_id, timeout_s
        self._connect = connect
        self._channels: dict[str, grpc.aio.Channel] = {ROOT: synchronizer}
        self._owned: list[grpc.aio.Channel] = []

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to `address` (`ROOT`: the synchronizer's), opened on first use."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._connect(address)
            self._owned.append(channel)
        return channel

    def source(self, address: str) -> Source:
        pull = self.channel(address).unary_stream(
            PULL, request_serializer=synchronizer_pb2.PullWeightsRequest.SerializeToString,
            response_deserializer=None,
        )  # fmt: skip
        peer = address != ROOT

        async def open_stream(version: int, have: int | None = None) -> AsyncIterator[bytes]:
            req = synchronizer_pb2.PullWeightsRequest(
                member_id=self.member_id, version=version, have_version=have
            )
            call = pull(req, timeout=self.timeout_s, wait_for_ready=not peer)
            try:
                async for raw in call:
                    yield raw
            finally:
                call.cancel()

        return open_stream

    def chain(self, addresses: Sequence[str]) -> list[tuple[str, Source]]:
        """(name, source) for each address, nearest first, as `relay.pull_version` takes them."""
        return [(a, self.source(a)) for a in addresses]

    async def close(self) -> None:
        for channel in self._owned:
            await channel.close()
        self._owned.clear()
        self._channels = {ROOT: self._channels[ROOT]}


class RelayNode:
    """One member's relay: its store, the registration to serve it, and `fetch` along a chain.

    node = RelayNode(PeerSources(sync_channel, member_id="explorer-3"))  # peers through `peer_channel`
    handle = await start_server([node.registration()], port=0)   # or beside the member's service
    stream = await node.fetch(version, plan["explorer-3"], have)  # (parent, ..., ROOT); a delta from have
    mv, base, data = join_raw_chunks(stream.chunks)              # base: None, or data is a delta

    Pull-through: a child asking for a version this relay has not begun (its own `WaitForVersion`
    has not come yet: the members of a run do not sync in lockstep) makes it begin that version at
    once along the chain of its last fetch (none before its first), instead of the child waiting,
    asking for a delta from what `held()` says this member holds then (None: in full).
    """

    def __init__(self, peers: PeerSources, *, stall_s: float = 10.0, wait_s: float = 30.0):
        self.store = RelayStore()
        self.peers = peers
        self.stall_s, self.wait_s = stall_s, wait_s
        self.chain: tuple[str, ...] | None = None  # the chain of the last fetch
        self.held: Callable[[], int | None] = lambda: None  # the version a delta may be from
        self._through: set[asyncio.Task] = set()
        # version notices for the children (notices.py): upstream along the last fetch's chain
        self.notices = Notices(peers.member_id, peers.channel, lambda: self.chain or (ROOT,))

    def registration(self) -> tuple:
        return registration(self.store, self.wait_s, self._pull_through, self.notices)

    async def fetch(self, version: int, chain: Sequence[str], have: int | None = None) -> VersionStream:
        """The complete stream of `version`, pulled along `chain` (nearest first), a delta from `have`
        where the sources can give one; raises `RelayBroken`."""
        self.chain = tuple(chain)
        stream = await pull_version(self.store, version, self.peers.chain(chain), self.stall_s, have)
        if not stream.complete:
            raise RelayBroken(stream.error or f"version {version} did not arrive")
        return stream

    def _pull_through(self, version: int) -> None:
        latest = self.store.latest_complete()
        if (
            self.chain is None
            or self.store.get(version) is not None
            or (latest and latest.version >= version)
        ):
            return
        task = asyncio.ensure_future(
            pull_version(self.store, version, self.peers.chain(self.chain), self.stall_s, self.held())
        )
        self._through.add(task)
        task.add_done_callback(self._through.discard)

    async def close(self) -> None:
        for task in list(self._through):
            task.cancel()
        await asyncio.gather(*self._through, return_exceptions=True)
        await self.notices.close()
        await self.peers.close()


@dataclass
class ServedRelay:
    """A `RelayNode` with its own server: `address` is what peers dial; `close()` stops both."""

    node: RelayNode
    handle: ServerHandle
    address: str

    async def close(self) -> None:
        await self.handle.stop(0)
        await self.node.close()


async def serve_relay(
    synchronizer: grpc.aio.Channel,
    member_id: str,
    *,
    host: str = "127.0.0.1",
    advertise_host: str = "",
    auth_token: str | None = None,
    tls=None,
    stall_s: float = 10.0,
    wait_s: float | None = None,
    timeout_s: float = 30.0,
    sync_timeout_s: float = 3600.0,
) -> ServedRelay:
    """A `RelayNode` served on a free port of `host` (auth and TLS as the member's service); its
    address is `advertise_host` (else `host`) and the port. `wait_s` (default `stall_s`): how long a
    child's pull waits for a version this relay has not begun."""

    def connect(address: str) -> grpc.aio.Channel:
        return peer_channel(address, auth_token=auth_token, tls=tls, timeout_s=timeout_s)

    wait = stall_s if wait_s is None else wait_s
    peers = PeerSources(synchronizer, connect, member_id, sync_timeout_s)
    node = RelayNode(peers, stall_s=stall_s, wait_s=wait)
    handle = await start_server([node.registration()], host=host, port=0, auth_token=auth_token, tls=tls)
    return ServedRelay(node, handle, f"{advertise_host or host}:{handle.port}")
