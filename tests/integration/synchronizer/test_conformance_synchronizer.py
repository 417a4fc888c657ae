"""`rft conformance synchronizer` against real servers: the project's synchronizer (a `python -m
services.synchronizer` process, auth on) passes every check under each sync_method and plan style,
skipping only the checks of another method; synchronizers broken on purpose (the real servicer with one
method overridden, on a real grpc.aio server, or the real one behind an auth check that parses first) fail
the check named for it, with exit code 1. The suite runs as the `rft` command in a subprocess."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from rft.v1 import synchronizer_pb2, synchronizer_pb2_grpc

from launcher.conformance.synchronizer import CHECKS
from services.common.config.sync_plan import SyncPlan
from services.common.rpc import create_channel, start_server
from services.common.rpc.decode import DecodeErrorInterceptor
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.errors import WrongState
from services.synchronizer.members import Role
from services.synchronizer.servicer import SERVICE_NAME, SynchronizerServicer, _version, add_to_server
from services.synchronizer.settings import SynchronizerSettings
from services.weight_sync import sync_method
from tests.support.conformance import conformance, service_process, statuses

TOKEN = "conformance-token"
NAMES = [c.name for c in CHECKS]
SKIPPED = {
    "memory": {"rendezvous"},
    "checkpoint": {"push_pull_weights", "rendezvous"},
    "nccl": {"push_pull_weights"},
}


def _config(tmp_path: Path, method: str, style: str, interval: int, offset: int, token: str = TOKEN) -> str:
    return (
        f"checkpoint_root_dir: {tmp_path}/checkpoints\n"
        f"synchronizer: {{sync_method: {method}, sync_style: {style}, sync_interval: {interval}, "
        f"sync_offset: {offset}}}\n"
        + (f"services: {{auth_token: {token}}}\n" if token else "")
        + "log: {level: WARNING}\n"
    )


def _expected(method: str, auth: bool = True) -> dict[str, str]:
    want = {name: "SKIP" if name in SKIPPED[method] else "PASS" for name in NAMES}
    if not auth:
        want["auth_before_parse"] = "SKIP"
    return want


@pytest.mark.parametrize(
    ("method", "style", "interval", "offset"),
    [("memory", "fixed", 2, 1), ("checkpoint", "trainer_driven", 3, 0), ("nccl", "explorer_driven", 2, 0)],
)
async def test_the_project_synchronizer_passes_every_check(method, style, interval, offset, tmp_path):
    config = _config(tmp_path, method, style, interval, offset)
    with service_process("synchronizer", config, tmp_path) as address:
        code, output = await conformance("synchronizer", address, "--auth-token", TOKEN)
        assert statuses(output) == _expected(method), output
        assert code == 0, output
        # a second run on the same server works above the versions the first one published
        code, output = await conformance("synchronizer", address, "--auth-token", TOKEN)
        assert code == 0 and statuses(output) == _expected(method), output
        # usage errors: a missing token; a synchronizer with a live member (a run uses it)
        code, output = await conformance("synchronizer", address)
        assert code == 2 and "--auth-token" in output, output
        async with create_channel(address, auth_token=TOKEN, timeout_s=10) as channel:
            member = synchronizer_pb2.Member(
                member_id="live-explorer", role=synchronizer_pb2.MEMBER_ROLE_EXPLORER
            )
            stub = synchronizer_pb2_grpc.SynchronizerServiceStub(channel)
            await stub.Register(synchronizer_pb2.RegisterRequest(member=member))
        code, output = await conformance("synchronizer", address, "--auth-token", TOKEN)
        assert code == 2 and "live-explorer" in output and "no run uses" in output, output


class StalePublishAccepted(SynchronizerServicer):
    """NotifyCheckpoint of a version not newer than the published one answers OK (the published version)
    instead of FAILED_PRECONDITION."""

    async def NotifyCheckpoint(self, request, context):
        try:
            published = await self.core.notify_checkpoint(
                request.version, request.step, request.checkpoint_path
            )
        except WrongState:
            published = self.core.published
        return synchronizer_pb2.NotifyCheckpointResponse(model_version=_version(published))


class ExplorerMayPublish(SynchronizerServicer):
    """RequestSync of an explorer is accepted instead of FAILED_PRECONDITION (wrong role)."""

    async def RequestSync(self, request, context):
        member = self.core.members.get(request.member_id)
        if member is not None and member.alive and member.role == Role.EXPLORER:
            return synchronizer_pb2.RequestSyncResponse(
                accepted=True, model_version=_version(self.core.published)
            )
        return await super().RequestSync(request, context)


class AuthAfterParse(grpc.aio.ServerInterceptor):
    """Checks the token only after the request body was parsed (a malformed body gets INVALID_ARGUMENT from
    the decode interceptor before the token is looked at): what `auth_before_parse` must catch."""

    def __init__(self, token: str):
        self.token = token

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or ("authorization", f"Bearer {self.token}") in tuple(
            details.invocation_metadata or ()
        ):
            return handler

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        if handler.request_streaming or handler.response_streaming:
            return grpc.unary_unary_rpc_method_handler(refuse)  # not judged: the unary calls fail first
        return grpc.unary_unary_rpc_method_handler(
            refuse,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _core(method: str) -> SynchronizerCore:
    return SynchronizerCore(SynchronizerSettings(method=sync_method(method), plan=SyncPlan("fixed", 1, 0)))


@pytest.mark.parametrize(
    ("breaks", "method", "check"),
    [
        ("stale_publish", "checkpoint", "versions_monotonic"),
        ("explorer_may_publish", "memory", "roles_and_methods"),
        ("auth_after_parse", "memory", "auth_before_parse"),
    ],
)
async def test_a_broken_synchronizer_fails_the_named_check(breaks, method, check):
    core = _core(method)
    await core.start()
    servicer_cls = {"stale_publish": StalePublishAccepted, "explorer_may_publish": ExplorerMayPublish}
    servicer = servicer_cls.get(breaks, SynchronizerServicer)(core)
    if breaks == "auth_after_parse":
        server = grpc.aio.server(interceptors=[DecodeErrorInterceptor(), AuthAfterParse(TOKEN)])
        add_to_server(servicer, server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        stop = server.stop
    else:
        handle = await start_server([(add_to_server, servicer, SERVICE_NAME)], port=0, auth_token=TOKEN)
        address, stop = handle.address, handle.stop
    try:
        code, output = await conformance("synchronizer", address, "--auth-token", TOKEN)
    finally:
        await stop(None)
        await core.close()
    found = statuses(output)
    assert found[check] == "FAIL", output
    assert code == 1, output
    others = {name: status for name, status in found.items() if name != check}
    assert others == {n: s for n, s in _expected(method).items() if n != check}, output


async def test_the_suite_judges_the_real_servicer_in_process_alike():
    """The servicer the broken ones subclass, unchanged on the same kind of server, passes: each failure above
    is the one its override makes."""
    core = _core("checkpoint")
    await core.start()
    handle = await start_server([(add_to_server, SynchronizerServicer(core), SERVICE_NAME)], port=0)
    try:
        code, output = await conformance("synchronizer", handle.address)
    finally:
        await handle.stop(None)
        await core.close()
    assert statuses(output) == _expected("checkpoint", auth=False), output
    assert code == 0, output
