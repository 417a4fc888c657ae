"""services/common/tracing.py: off by default at no cost, on by `monitor.tracing` or the OTEL_* environment,
`service.name` set per service; the experiences' stamps become span links."""

from __future__ import annotations

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing
from services.common.config.runtime import TracingConfig
from services.common.experience import Experience
from services.common.rpc.trace_context import client_trace_interceptors

ENV_ON = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}


@pytest.fixture(autouse=True)
def _off_after():
    yield
    tracing.shutdown_tracing()


def test_off_by_default_is_a_shared_null_context_and_no_interceptors():
    assert tracing.setup_tracing("buffer", TracingConfig(), environ={}) is False
    assert not tracing.enabled()
    assert tracing.span("a") is tracing.span("b")  # one null context, nothing made per call
    with tracing.span("trainer.step") as span:
        assert span is None
        assert tracing.traceparent() is None
    assert client_trace_interceptors() == []
    exp = Experience(tokens=torch.tensor([1, 2]), prompt_length=1)
    tracing.stamp([exp])
    assert tracing.TRACEPARENT not in exp.info


@pytest.mark.parametrize(
    ("config", "environ", "on"),
    [
        (TracingConfig(), ENV_ON, True),  # the environment alone
        (TracingConfig(enabled=True), {}, True),  # the config section alone
        (TracingConfig(), {"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        (TracingConfig(), {"OTEL_TRACES_EXPORTER": "none"}, False),
        (TracingConfig(enabled=True), {**ENV_ON, "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_turned_on_by_config_or_environment(config, environ, on):
    assert tracing.setup_tracing("trainer", config, environ=environ) is on
    assert tracing.enabled() is on
    assert (len(client_trace_interceptors()) == 4) is on


@pytest.mark.parametrize("service", ["trainer", "explorer", "buffer", "synchronizer"])
def test_each_service_names_itself(service):
    assert tracing.setup_tracing(service, TracingConfig(), environ=ENV_ON)
    assert tracing._STATE["provider"].resource.attributes["service.name"] == f"rft-{service}"


def test_a_protocol_it_cannot_export_names_the_variable_and_the_fix():
    with pytest.raises(tracing.TracingSetupError, match="OTEL_EXPORTER_OTLP_PROTOCOL=grpc.*http/protobuf"):
        tracing.setup_tracing("buffer", None, environ={**ENV_ON, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert not tracing.enabled()


def test_config_endpoint_gets_the_traces_path():
    assert tracing._traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert tracing._traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


def test_stamped_experiences_become_links_of_the_get_batch_span():
    exporter = InMemorySpanExporter()
    tracing.setup_tracing("explorer", None, exporter=exporter)
    batch = [Experience(tokens=torch.tensor([1, 2]), prompt_length=1) for _ in range(3)]
    with tracing.span("explorer.put") as put:
        tracing.stamp(batch[:2])
    with tracing.span("explorer.put") as other:
        tracing.stamp(batch[2:])
    with tracing.span("trainer.get_batch") as get:
        assert tracing.link_stamped(get, batch) == 2
    spans = {s.context.span_id: s for s in exporter.get_finished_spans()}
    linked = {link.context.span_id for link in spans[get.get_span_context().span_id].links}
    assert linked == {put.get_span_context().span_id, other.get_span_context().span_id}
    with tracing.child_span("orphan") as orphan:  # no current span: no trace of its own
        assert orphan is None
