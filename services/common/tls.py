"""TLS helpers shared by the gRPC kit (`services.common.rpc`) and the health probe (`healthcheck`):
reading the PEM files a config names, and finding out why a connection fails at the TLS layer.

gRPC tells a client little when TLS fails. With TLS 1.3 the client finishes its side of the handshake
before the server checks the client's certificate, and a gRPC server that refuses it (none, signed by
another CA, expired) closes the connection without a TLS alert: the client sees `UNAVAILABLE: Socket
closed`, or with `wait_for_ready` a bare `DEADLINE_EXCEEDED`; a plaintext client of a TLS server sees
the same. `handshake_problem` repeats the handshake with Python's `ssl` and the same files and says
what went wrong; for a refused certificate it finds the reason on the client's side (none given, or
one that the client's own `ca_file` does not accept either: expired, another CA, not made for
clients, checked by a handshake between two in-memory ends), and quotes the alert of a server that
sends one. Only the standard library is used, so the health probe stays light.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from pathlib import Path

# An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its SETTINGS; one that
# refused the client's certificate closes the connection (or sends its TLS alert) instead.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

# The client's settings, named in the messages; the health probe passes its own flags instead.
CONFIG_NAMES = {
    "ca": "services.tls.ca_file",
    "cert": "services.tls.client_cert_file and client_key_file, or cert_file and key_file",
}

# OpenSSL reason of the server's alert -> what it says about this client's certificate.
_ALERTS = (
    ("CERTIFICATE_REQUIRED", "the server requires a client certificate and this client presented none"),
    ("UNKNOWN_CA", "the server does not trust this client's certificate: it is signed by a CA the server's "
     "ca_file does not hold"),
    ("CERTIFICATE_EXPIRED", "the server refused this client's certificate: it has expired"),
    ("CERTIFICATE_REVOKED", "the server refused this client's certificate: it is revoked"),
    ("UNSUPPORTED_CERTIFICATE", "the server refused this client's certificate: not usable for a client "
     "(extended key usage lacks clientAuth)"),
    ("BAD_CERTIFICATE", "the server refused this client's certificate"),
    ("ACCESS_DENIED", "the server refused this client's certificate"),
    ("HANDSHAKE_FAILURE", "the server refused the TLS handshake (no client certificate, or none it accepts)"),
)  # fmt: skip
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNEXPECTED_EOF", "PACKET_LENGTH_TOO_LONG",
            "HTTP_REQUEST")  # fmt: skip


class TLSFileError(OSError):
    """A TLS file a setting names cannot be read; the message names the setting and the path."""


def read_tls_file(path: str, setting: str) -> bytes:
    """The bytes of `path`, or TLSFileError naming `setting` (e.g. `services.tls.cert_file`)."""
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise TLSFileError(
            exc.errno or 0, f"{setting} {path!r} cannot be read: {exc.strerror or exc}"
        ) from None


def _split(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _alert_meaning(exc: ssl.SSLError, names: Mapping[str, str]) -> str | None:
    reason = (exc.reason or "").upper()
    if "ALERT" not in reason:
        return None
    for key, meaning in _ALERTS:
        if key in reason:
            fix = f"give the client a current certificate and key signed by the server's CA: {names['cert']}"
            return f"{meaning} (TLS alert {exc.reason}); {fix}"
    return f"the server ended the TLS handshake with alert {exc.reason}"


def handshake_problem(
    target: str,
    *,
    tls: bool = True,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    timeout_s: float = 3.0,
    names: Mapping[str, str] = CONFIG_NAMES,
) -> str | None:
    """Why a client with these files (`tls=False`: a plaintext client) cannot talk to the gRPC server at
    `target` (host:port) because of TLS, in one sentence; None when TLS is not the problem (the
    handshake works, or nothing answers at all)."""
    try:
        host, port = _split(target)
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except (OSError, ValueError):
        return None  # nothing listens: not a TLS problem
    with raw:
        if not tls:
            return _plaintext_problem(raw, target, names)
        try:
            context = ssl.create_default_context(cafile=ca_file)
            if cert_file:
                context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            return f"this client's TLS files do not load: {exc}"
        context.set_alpn_protocols(["h2"])
        try:
            with context.wrap_socket(raw, server_hostname=host) as conn:
                conn.sendall(_H2_PREFACE)
                if conn.recv(1):  # the server's SETTINGS: TLS works
                    return None
        except ssl.SSLCertVerificationError as exc:
            trusted = f"{names['ca']} {ca_file}" if ca_file else "the default CA roots"
            return (
                f"this client does not trust the server's certificate: {exc.verify_message} "
                f"(checked against {trusted})"
            )
        except ssl.SSLError as exc:
            reason = (exc.reason or "").upper()
            if any(key in reason for key in _NOT_TLS):
                return f"the server at {target} does not speak TLS (is services.tls off there?)"
            return _alert_meaning(exc, names)
        except (ConnectionError, TimeoutError, OSError):
            return None
    # The handshake completed and the server hung up without a word: it refused this client's certificate.
    fix = f"give the client a current certificate and key signed by the server's CA: {names['cert']}"
    if not cert_file:
        return f"the server requires a client certificate and this client presented none; {fix}"
    own = own_certificate_problem(cert_file, key_file, ca_file)
    if own and "issuer" in own:
        own += f" (it is not signed by the CA in {names['ca']})"
    elif own and "purpose" in own:
        own += " (its extended key usage lacks clientAuth)"
    if own:
        return f"the server refused this client's certificate {cert_file}: {own}; {fix}"
    return (
        f"the server refused this client's certificate {cert_file}, which {names['ca']} accepts: "
        f"the server trusts another CA; {fix}"
    )


def own_certificate_problem(cert_file: str, key_file: str | None, ca_file: str | None) -> str | None:
    """What OpenSSL finds wrong with a client certificate when a server trusting `ca_file` checks it
    (e.g. "certificate has expired", "unable to get local issuer certificate"), by a TLS handshake
    between two in-memory ends; None when such a server accepts it."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        server.load_cert_chain(cert_file, key_file)  # any certificate will do for the server's end
        server.verify_mode = ssl.CERT_REQUIRED
        if ca_file:
            server.load_verify_locations(ca_file)
        else:
            server.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        client.check_hostname = False
        client.verify_mode = ssl.CERT_NONE
        client.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        return f"it does not load: {exc}"
    bios = [ssl.MemoryBIO() for _ in range(4)]
    ends = [
        client.wrap_bio(bios[0], bios[1], server_hostname="client-check"),
        server.wrap_bio(bios[2], bios[3], server_side=True),
    ]
    done = [False, False]
    for _ in range(10):
        for i, end in enumerate(ends):
            if done[i]:
                continue
            try:
                end.do_handshake()
                done[i] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as exc:
                return exc.verify_message
            except ssl.SSLError as exc:
                return None if i == 0 else str(exc.reason or exc)
        bios[2].write(bios[1].read())  # client -> server
        bios[0].write(bios[3].read())  # server -> client
        if all(done):
            return None
    return None


def _plaintext_problem(raw: socket.socket, target: str, names: Mapping[str, str]) -> str | None:
    """A TLS handshake that checks nothing: if the server answers it, it serves TLS to a plaintext client."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with context.wrap_socket(raw, server_hostname=None) as conn:
            conn.version()
    except ssl.SSLError as exc:
        if "ALERT" not in (exc.reason or "").upper():
            return None  # not a TLS server
    except OSError:
        return None
    return f"the server at {target} serves TLS and this client dials plaintext: set {names['ca']}"
