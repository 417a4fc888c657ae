"""OpenTelemetry traces of the services (docs/traces.md): off by default, on with `monitor.tracing.enabled`
or the standard environment alone (`OTEL_TRACES_EXPORTER=otlp`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`, which `rft run` passes on to every service it starts).

`setup_tracing(service, config)` makes this process's tracer (`service.name` = `rft-<service>`), exporting
over OTLP/HTTP in the background. Off, `span(...)` is one shared null context and no gRPC interceptor is
installed (services/common/rpc/trace_context.py), so nothing is paid. An experience's put stamps its span
context in `info["traceparent"]` (`stamp`); the trainer's get-batch span links to them (`link_stamped`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

SERVICE_NAMES = {s: f"rft-{s}" for s in ("trainer", "explorer", "buffer", "synchronizer")}
TRACEPARENT = "traceparent"
PROTOCOL = "http/protobuf"

_NULL = contextlib.nullcontext()
_STATE: dict[str, Any] = {"tracer": None, "provider": None}


class TracingSetupError(ValueError):
    """Tracing asked for in a way this build cannot export (names the setting and the fix)."""


def enabled() -> bool:
    return _STATE["tracer"] is not None


def tracer() -> Any:
    """The tracer when tracing is on, else None."""
    return _STATE["tracer"]


def wanted(config: Any = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether tracing is asked for: `monitor.tracing.enabled`, or `OTEL_TRACES_EXPORTER` naming otlp;
    `OTEL_SDK_DISABLED=true` wins over both."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if config is not None and config.enabled:
        return True
    return "otlp" in [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")]


def _traces_url(endpoint: str) -> str:
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def setup_tracing(
    service: str,
    config: Any = None,
    *,
    environ: Mapping[str, str] | None = None,
    exporter: Any = None,
    instance: str | None = None,
) -> bool:
    """Turn tracing on for this process when asked (`wanted`) or when `exporter` is given (tests: spans
    go to it synchronously); returns whether it is on. `config` is `monitor.tracing`. Raises
    `TracingSetupError` for an OTLP protocol other than http/protobuf."""
    env = os.environ if environ is None else environ
    if exporter is None and not wanted(config, env):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    attributes = {"service.name": SERVICE_NAMES.get(service, service)}
    if instance:
        attributes["service.instance.id"] = instance
    ratio = config.sample_ratio if config is not None else 1.0
    sampler = ParentBased(ALWAYS_ON if ratio >= 1.0 else TraceIdRatioBased(ratio))
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        var = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
        var = var if env.get(var) else "OTEL_EXPORTER_OTLP_PROTOCOL"
        protocol = env.get(var) or PROTOCOL
        if protocol != PROTOCOL:
            raise TracingSetupError(
                f"{var}={protocol}: traces are exported over OTLP/HTTP only; set {var}={PROTOCOL} "
                "(the collector's port 4318) or unset it"
            )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = config.endpoint if config is not None and config.endpoint else None
        otlp = OTLPSpanExporter(endpoint=_traces_url(endpoint) if endpoint else None)
        provider.add_span_processor(BatchSpanProcessor(otlp, schedule_delay_millis=1000))
    shutdown_tracing()
    _STATE["provider"] = provider
    _STATE["tracer"] = provider.get_tracer("rft-mesh")
    return True


def shutdown_tracing() -> None:
    """Export what is pending and turn tracing off (at a service's stop; between tests)."""
    provider, _STATE["provider"], _STATE["tracer"] = _STATE["provider"], None, None
    if provider is not None:
        provider.shutdown()


def span(name: str, attributes: Mapping[str, Any] | None = None) -> Any:
    """A context manager: the span `name` as the current span (yields it), or a null context when off."""
    t = _STATE["tracer"]
    if t is None:
        return _NULL
    return t.start_as_current_span(name, attributes=attributes)


def child_span(name: str, attributes: Mapping[str, Any] | None = None) -> Any:
    """As `span`, but only under a current span (a workflow's worker thread, which does not carry the
    step's context, makes no trace of its own)."""
    t = _STATE["tracer"]
    if t is None:
        return _NULL
    from opentelemetry import trace

    if not trace.get_current_span().get_span_context().is_valid:
        return _NULL
    return t.start_as_current_span(name, attributes=attributes)


def traceparent() -> str | None:
    """The current span's context as a W3C `traceparent` value, or None (off, or no span)."""
    if _STATE["tracer"] is None:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT)


def stamp(experiences: Iterable[Any]) -> None:
    """Put the current span's context in each experience's `info` (only when on), so the trainer's
    get-batch span can link to the put that brought it."""
    value = traceparent()
    if value is None:
        return
    for exp in experiences:
        exp.info[TRACEPARENT] = value


def link_stamped(current: Any, experiences: Iterable[Any]) -> int:
    """Add to span `current` a link to each distinct span context stamped on `experiences`; returns
    how many (0 when off or nothing is stamped)."""
    if current is None or _STATE["tracer"] is None:
        return 0
    from opentelemetry import propagate, trace

    seen = {e.info.get(TRACEPARENT) for e in experiences} - {None}
    for value in sorted(seen):
        ctx = trace.get_current_span(propagate.extract({TRACEPARENT: value})).get_span_context()
        if ctx.is_valid:
            current.add_link(ctx)
    return len(seen)
