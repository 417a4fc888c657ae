"""`services.tls` on real `grpc.aio` servers (port 0) with certificates made by the test: a TLS server
answers a client that trusts its CA and refuses a plaintext one; with `client_auth` (mutual TLS) a client
with no certificate, one signed by another CA or an expired one is refused, and the client's error
(UNAUTHENTICATED from `rpc.client.TLSDiagnosis`) says why; the health probe works over mutual TLS
and says why when it cannot; unreadable TLS files and half-set sections fail naming the setting."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rft.v1 import buffer_pb2_grpc

from launcher.preflight import path_problems, tls_problems
from services.common.config import ConfigError, load_config
from services.common.config.services import TLSConfig
from services.common.healthcheck import main as probe
from services.common.rpc import create_channel, start_server
from services.common.rpc.server import TLSSetupError
from tests.support.tls_certs import Pki

SERVICE = "rft.v1.BufferService"
TIMEOUT_S = 2.0  # the refused calls wait for the channel this long (wait_for_ready)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca, other = Pki.create(folder / "ca"), Pki.create(folder / "other", "another CA")
    return {
        "ca": ca,
        "server": ca.server(),
        "client": ca.client("trainer"),
        "expired": ca.client("old", expired=True),
        "stranger": other.client("mallory"),
        "other_ca": other.ca_file,
    }


def _tls(pki, *, client_auth: bool = False, **files) -> TLSConfig:
    server = pki["server"]
    fields = {
        "cert_file": str(server.cert_file),
        "key_file": str(server.key_file),
        "ca_file": str(pki["ca"].ca_file),
    }
    return TLSConfig(**{**fields, "client_auth": client_auth, **files})


def _client(pki, cert=None, *, ca_file=None) -> TLSConfig:
    """A client-only TLS section: the CA (plaintext server side) and an optional client certificate."""
    files = {"ca_file": str(ca_file or pki["ca"].ca_file)}
    if cert is not None:
        files |= {"client_cert_file": str(cert.cert_file), "client_key_file": str(cert.key_file)}
    return TLSConfig(**files)


async def _serve(tls: TLSConfig | None):
    servicer = buffer_pb2_grpc.BufferServiceServicer()
    return await start_server(
        [(buffer_pb2_grpc.add_BufferServiceServicer_to_server, servicer, SERVICE)], tls=tls
    )


async def _check(address: str, tls: TLSConfig | None) -> int:
    async with create_channel(address, tls=tls, timeout_s=TIMEOUT_S) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE)
        )
    return reply.status


async def _refused(address: str, tls: TLSConfig | None) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _check(address, tls)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value
    return info.value.details()


async def test_tls_server_answers_a_client_that_trusts_its_ca_and_refuses_plaintext(pki):
    handle = await _serve(_tls(pki))
    try:
        assert await _check(handle.address, _client(pki)) == health_pb2.HealthCheckResponse.SERVING
        # the server itself refuses plaintext: a bare gRPC channel never gets an answer
        async with grpc.aio.insecure_channel(handle.address) as bare:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await health_pb2_grpc.HealthStub(bare).Check(
                    health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S
                )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # and the project's client says why
        details = await _refused(handle.address, None)
        assert f"the server at {handle.address} serves TLS and this client dials plaintext" in details
        assert "services.tls.ca_file" in details
        # a client that does not trust the server's CA
        details = await _refused(handle.address, _client(pki, ca_file=pki["other_ca"]))
        assert "does not trust the server's certificate: unable to get local issuer certificate" in details
        assert str(pki["other_ca"]) in details
    finally:
        await handle.stop(0)


async def test_a_tls_client_of_a_plaintext_server_is_told_so(pki):
    handle = await _serve(None)
    try:
        details = await _refused(handle.address, _client(pki))
        assert f"the server at {handle.address} does not speak TLS" in details
    finally:
        await handle.stop(0)


async def test_mutual_tls_refuses_clients_without_a_valid_certificate_and_says_why(pki):
    handle = await _serve(_tls(pki, client_auth=True))
    try:
        good = _client(pki, pki["client"])
        assert await _check(handle.address, good) == health_pb2.HealthCheckResponse.SERVING

        details = await _refused(handle.address, _client(pki))
        assert "the server requires a client certificate and this client presented none" in details
        assert "services.tls.client_cert_file and client_key_file" in details

        stranger = pki["stranger"]
        details = await _refused(handle.address, _client(pki, stranger))
        assert f"the server refused this client's certificate {stranger.cert_file}" in details
        assert (
            "unable to get local issuer certificate (it is not signed by the CA in services.tls.ca_file)"
            in details
        )

        expired = pki["expired"]
        details = await _refused(handle.address, _client(pki, expired))
        assert (
            f"the server refused this client's certificate {expired.cert_file}: certificate has expired"
            in details
        )

        # what gRPC itself reported stays in the message
        assert "DEADLINE_EXCEEDED" in details or "UNAVAILABLE" in details
    finally:
        await handle.stop(0)


async def test_without_client_files_the_clients_present_the_service_certificate(pki):
    # client_auth with no client_cert_file: the clients present cert_file, which must allow clientAuth
    handle = await _serve(_tls(pki, client_auth=True))
    try:
        details = await _refused(handle.address, _tls(pki, client_auth=True))  # serverAuth only
        assert f"the server refused this client's certificate {pki['server'].cert_file}" in details
        assert "certificate purpose (its extended key usage lacks clientAuth)" in details
        both = pki["ca"].server("both", client_too=True)
        tls = _tls(pki, client_auth=True, cert_file=str(both.cert_file), key_file=str(both.key_file))
        assert tls.client_identity == (str(both.cert_file), str(both.key_file))
        assert await _check(handle.address, tls) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await handle.stop(0)


async def test_health_probe_over_mutual_tls(pki, capsys):
    handle = await _serve(_tls(pki, client_auth=True))
    try:
        client, ca = pki["client"], str(pki["ca"].ca_file)
        args = [handle.address, "--timeout", str(TIMEOUT_S), "--ca-file", ca]
        with_cert = [*args, "--cert-file", str(client.cert_file), "--key-file", str(client.key_file)]
        assert await asyncio.to_thread(probe, with_cert) == 0
        assert f"{handle.address}: SERVING" in capsys.readouterr().out

        assert await asyncio.to_thread(probe, args) == 1
        err = capsys.readouterr().err
        assert "TLS: the server requires a client certificate and this client presented none" in err
        assert "--cert-file and --key-file" in err

        expired = pki["expired"]
        assert await asyncio.to_thread(probe, [*args, "--cert-file", str(expired.cert_file),
                                               "--key-file", str(expired.key_file)]) == 1  # fmt: skip
        assert "certificate has expired" in capsys.readouterr().err

        assert await asyncio.to_thread(probe, [handle.address, "--timeout", str(TIMEOUT_S)]) == 1
        assert "serves TLS and this client dials plaintext: set --ca-file" in capsys.readouterr().err
    finally:
        await handle.stop(0)


async def test_health_probe_takes_its_files_from_the_environment(pki, monkeypatch, capsys):
    handle = await _serve(_tls(pki, client_auth=True))
    try:
        client = pki["client"]
        monkeypatch.setenv("RFT_TLS_CA_FILE", str(pki["ca"].ca_file))
        monkeypatch.setenv("RFT_TLS_CERT_FILE", str(pki["server"].cert_file))  # the service's own: ignored
        monkeypatch.setenv("RFT_TLS_KEY_FILE", str(pki["server"].key_file))
        monkeypatch.setenv("RFT_TLS_CLIENT_CERT_FILE", str(client.cert_file))
        monkeypatch.setenv("RFT_TLS_CLIENT_KEY_FILE", str(client.key_file))
        assert await asyncio.to_thread(probe, [handle.address]) == 0
        assert f"{handle.address}: SERVING" in capsys.readouterr().out
    finally:
        await handle.stop(0)


async def test_unreadable_server_files_name_the_setting(pki, tmp_path):
    missing = tmp_path / "nope.pem"
    with pytest.raises(TLSSetupError) as info:
        await _serve(_tls(pki, cert_file=str(missing)))
    assert (
        f"services.tls.cert_file '{missing}' cannot be read: No such file or directory" == info.value.strerror
    )


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ({"cert_file": "s.pem"}, "services.tls: cert_file is set but key_file is not"),
        ({"client_key_file": "c.key"}, "services.tls: client_key_file is set but client_cert_file is not"),
        ({"cert_file": "s.pem", "key_file": "s.key", "client_auth": True},
         "services.tls: client_auth: true needs ca_file (the CA that signs the client certificates)"),
        ({"ca_file": "ca.pem", "client_auth": True}, "client_auth: true needs cert_file and key_file"),
        ({"client_auht": True}, "services.tls.client_auht: unknown key (value True); did you mean `client_auth`?"),
    ],
)  # fmt: skip
def test_half_set_tls_sections_are_refused_at_load(tmp_path, tls, message):
    config = tmp_path / "run.yaml"
    config.write_text("services:\n  tls: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(config), overrides=[f"services.tls.{k}={v}" for k, v in tls.items()])
    assert message in str(info.value)


def test_rft_run_preflight_names_a_missing_tls_file_and_a_missing_ca(pki, tmp_path):
    server, missing = pki["server"], tmp_path / "ca.pem"
    config = tmp_path / "run.yaml"
    config.write_text(
        f"services:\n  tls: {{cert_file: {server.cert_file}, key_file: {server.key_file}, ca_file: {missing}}}\n"
    )
    assert f"services.tls.ca_file '{missing}' is not a file" in path_problems([load_config(str(config))])
    no_ca = load_config(str(config), overrides=["services.tls.ca_file=null"])
    assert not [p for p in path_problems([no_ca]) if "services.tls" in p]
    [problem] = tls_problems(no_ca)
    assert problem.startswith("services.tls.cert_file is set but services.tls.ca_file is not")
