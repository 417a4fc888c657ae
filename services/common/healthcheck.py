"""A tiny gRPC health probe for orchestrators: `python -m services.common.healthcheck HOST:PORT`.

Asks the standard `grpc.health.v1.Health/Check` of a running service (every RFT Mesh server has it,
and it stays open when a bearer token is configured) and exits 0 when the answer is SERVING, 1 when
it is anything else or the service cannot be reached within the deadline. It is what the compose
healthchecks run inside each image, so it must not need anything the image lacks (no grpcurl, no
grpc_health_probe binary):

    healthcheck:
      test: ["CMD", "python", "-m", "services.common.healthcheck", "127.0.0.1:50051"]

With TLS on, pass the CA bundle (`--ca-file`, or `RFT_TLS_CA_FILE`) so the probe verifies the server;
with mutual TLS (`services.tls.client_auth`) also a client certificate and key (`--cert-file` and
`--key-file`, or `RFT_TLS_CLIENT_CERT_FILE`/`RFT_TLS_CLIENT_KEY_FILE`, else the service's own
`RFT_TLS_CERT_FILE`/`RFT_TLS_KEY_FILE`). A probe that fails because of TLS says why
(`services.common.tls.handshake_problem`: a refused or untrusted certificate, TLS on one side only).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.tls import handshake_problem

SERVING = health_pb2.HealthCheckResponse.SERVING


def check(
    target: str,
    service: str = "",
    timeout_s: float = 3.0,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> str:
    """The health status name of `service` ("" = the whole server) at `target`, e.g. "SERVING". TLS when
    `ca_file` or a client certificate (`cert_file` + `key_file`) is given.

    Raises grpc.RpcError when the server cannot be reached or does not know `service`."""
    if ca_file or cert_file:
        creds = grpc.ssl_channel_credentials(
            root_certificates=Path(ca_file).read_bytes() if ca_file else None,
            private_key=Path(key_file).read_bytes() if cert_file and key_file else None,
            certificate_chain=Path(cert_file).read_bytes() if cert_file and key_file else None,
        )
        channel = grpc.secure_channel(target, creds)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.common.healthcheck",
        description="Exit 0 when the gRPC health service at HOST:PORT answers SERVING, 1 otherwise.",
    )
    parser.add_argument("target", help="HOST:PORT of the service")
    parser.add_argument("--service", default="", help="service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="deadline in seconds (default 3)")
    parser.add_argument(
        "--ca-file",
        default=os.environ.get("RFT_TLS_CA_FILE") or None,
        help="CA bundle to verify a TLS server (default: RFT_TLS_CA_FILE; plaintext when unset)",
    )
    env = os.environ
    parser.add_argument(
        "--cert-file",
        default=env.get("RFT_TLS_CLIENT_CERT_FILE") or env.get("RFT_TLS_CERT_FILE") or None,
        help="client certificate for mutual TLS (default: RFT_TLS_CLIENT_CERT_FILE, else RFT_TLS_CERT_FILE)",
    )
    parser.add_argument(
        "--key-file",
        default=env.get("RFT_TLS_CLIENT_KEY_FILE") or env.get("RFT_TLS_KEY_FILE") or None,
        help="its private key (default: RFT_TLS_CLIENT_KEY_FILE, else RFT_TLS_KEY_FILE)",
    )
    args = parser.parse_args(argv)
    if bool(args.cert_file) != bool(args.key_file):
        parser.error("--cert-file and --key-file go together: a client certificate needs its key")
    files = {"ca_file": args.ca_file, "cert_file": args.cert_file, "key_file": args.key_file}
    try:
        status = check(args.target, args.service, args.timeout, **files)
    except grpc.RpcError as exc:
        why = ""
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            names = {"ca": "--ca-file", "cert": "--cert-file and --key-file"}
            tls = bool(args.ca_file or args.cert_file)
            problem = handshake_problem(args.target, tls=tls, timeout_s=args.timeout, names=names, **files)
            why = f"; TLS: {problem}" if problem else ""
        print(f"{args.target}: {exc.code().name}: {exc.details()}{why}", file=sys.stderr)
        return 1
    except OSError as exc:  # unreadable CA file
        print(f"{args.target}: {exc}", file=sys.stderr)
        return 1
    print(f"{args.target}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
