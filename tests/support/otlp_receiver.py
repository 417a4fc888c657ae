"""A real OTLP/HTTP trace receiver for tests and benches: a threaded HTTP server on a free port that
answers `POST /v1/traces` like a collector, decoding each protobuf `ExportTraceServiceRequest` (the
opentelemetry-proto messages) into `ReceivedSpan`s, with the service name of the resource that sent it.

    with OTLPReceiver() as rx:
        env = rx.environ()          # OTEL_TRACES_EXPORTER=otlp, OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:N
        ...
        rx.spans                    # everything received so far
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    links: tuple[tuple[str, str], ...]  # (trace_id, span_id) of each link
    attributes: dict


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    out = []
    for resource_spans in request.resource_spans:
        attrs = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        service = str(attrs.get("service.name", ""))
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                out.append(
                    ReceivedSpan(
                        service=service,
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                    )
                )
    return out


class OTLPReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def environ(self) -> dict[str, str]:
        """The standard variables that turn tracing on and point it here."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }

    def __enter__(self) -> OTLPReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
