"""The Prometheus files deploy/ ships: the scrape config and the rules pass `promtool check`, each alert
fires on the series that describe its condition and stays quiet before (`promtool test rules` on
deploy/prometheus/tests/rules_test.yml), and every `rft_*` series the rules read is one the services
export under that name (the exporters fed the keys a trainer and an explorer log)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from services.buffer.metrics import metric_families as buffer_families
from services.buffer.records import StoreStats
from services.common.config import load_config
from services.common.prometheus_steps import SERIES, StepExport
from services.synchronizer.members import Member, MemberStatus, Role
from services.synchronizer.metrics import metric_families as synchronizer_families
from services.synchronizer.records import Published, RunState

ROOT = Path(__file__).resolve().parents[3]
PROM = ROOT / "deploy" / "prometheus"
RULES = sorted((PROM / "rules").glob("*.yml"))
promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None, reason="promtool (Debian's prometheus) is not installed"
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert promtool is not None
    return subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_checks_the_config_and_rules_and_every_alert_test_passes():
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", *map(str, RULES)),
                 ("test", "rules", "tests/rules_test.yml")):  # fmt: skip
        done = _promtool(*args)
        assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", (PROM / "tests" / "rules_test.yml").read_text()))
    shipped = set(re.findall(r"- alert: (\w+)", "".join(p.read_text() for p in RULES)))
    assert shipped and tested == shipped  # every alert has a firing test


class _Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def _exported_names() -> set[str]:
    """Sample names the four services expose, from their real exporters (none of them started)."""
    trainer, explorer = (
        StepExport("trainer", "t", {"checkpoint_interval_steps": 5}),
        StepExport("explorer", "e"),
    )
    for export in (trainer, explorer):
        export.log({s.key: 1.0 for s in SERIES[export.role] if s.key}, step=3)
    stats = StoreStats(store="redis", size=3, capacity=10, pending_leases=1, pending_experiences=2)
    member = Member("explorer-0", Role.EXPLORER, MemberStatus.RUNNING, model_version=2)
    state = RunState(members=(member,), published=Published(3, 3), trainer_step=3, explorer_step=3,
                     settings=None, sync_in_progress=False, finished=False, generation=1, pending_version=0)  # type: ignore[arg-type]  # fmt: skip
    registry = CollectorRegistry()
    for families in (trainer.families(), explorer.families(), buffer_families({"trainer": stats}),
                     synchronizer_families(state, Counter(reported=1))):  # fmt: skip
        registry.register(_Families(families))
    text = generate_latest(registry).decode()
    trainer.close()
    explorer.close()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_series_the_rules_read_is_exported():
    read = set(re.findall(r"\b(rft_[a-z_]+)\b", "".join(p.read_text() for p in RULES)))
    assert {"rft_trainer_last_step_timestamp_seconds", "rft_buffer_size"} <= read
    missing = read - _exported_names()
    assert not missing, f"the rules read series no service exports: {sorted(missing)}"


def test_counters_end_in_total_and_gauges_keep_their_last_value():
    export = StepExport("trainer", "demo_trainer")
    export.log({"perf/total_num_tokens": 100.0, "timing_s/step": 2.0}, step=1)
    export.log({"perf/total_num_tokens": 50.0, "timing_s/step": float("nan")}, step=2)
    samples = {s.name: s.value for f in export.families() for s in f.samples}
    export.close()
    assert samples["rft_trainer_tokens_total"] == 150.0 and samples["rft_trainer_steps_total"] == 2.0
    assert samples["rft_trainer_step_seconds"] == 2.0  # a NaN step time keeps the last one
    assert samples["rft_trainer_step"] == 2.0 and samples["rft_trainer_last_step_timestamp_seconds"] > 0
    with pytest.raises(ValueError, match="no Prometheus series for role 'critic'"):
        StepExport("critic", "x")


def test_the_scrape_config_covers_every_service_of_the_stack_at_its_metrics_port():
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    run = load_config(ROOT / "deploy" / "config" / "run.yaml")
    scrape = yaml.safe_load((PROM / "prometheus.yml").read_text())
    targets = {}
    for job in scrape["scrape_configs"]:
        for sd in job.get("static_configs", []):
            targets[job["job_name"]] = sd["targets"]
        for sd in job.get("dns_sd_configs", []):
            targets[job["job_name"]] = [f"{name}:{sd['port']}" for name in sd["names"]]
    for name in ("synchronizer", "buffer", "trainer", "explorer"):
        assert name in compose["services"]
        port = getattr(run.services, name).metrics_port
        assert targets[f"rft-{name}"] == [f"{name}:{port}"], targets
    overlay = yaml.safe_load((ROOT / "deploy" / "docker-compose.prometheus.yml").read_text())
    service = overlay["services"]["prometheus"]
    assert "./prometheus:/etc/prometheus:ro" in service["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in service["command"]
    assert scrape["rule_files"] == ["/etc/prometheus/rules/*.yml"]


def test_the_kubernetes_scrape_config_names_each_pod_of_the_manifests_as_the_rules_expect():
    """Debian's promtool lacks Kubernetes discovery, so the relabelling is applied here by hand (its
    regexes, Prometheus's fully anchored matching) to the pods of deploy/k8s."""
    config = yaml.safe_load((PROM / "kubernetes.yml").read_text())
    [job] = config["scrape_configs"]
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    pods = []
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            template = ((doc or {}).get("spec") or {}).get("template")
            if template and "prometheus.io/scrape" in (template["metadata"].get("annotations") or {}):
                pods.append(template)
    jobs = set()
    for pod in pods:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        meta = {
            "__address__": "10.1.2.3:50053",
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": annotations["prometheus.io/scrape"],
            "__meta_kubernetes_pod_annotation_prometheus_io_port": annotations["prometheus.io/port"],
            "__meta_kubernetes_pod_label_app_kubernetes_io_part_of": labels["app.kubernetes.io/part-of"],
            "__meta_kubernetes_pod_label_app_kubernetes_io_component": labels["app.kubernetes.io/component"],
            "__meta_kubernetes_pod_name": "p",
        }
        for rule in job["relabel_configs"]:
            value = ";".join(meta.get(s, "") for s in rule["source_labels"])
            found = re.fullmatch(rule.get("regex", "(.*)"), value)
            if rule.get("action") == "keep":
                assert found, (rule, value)
            elif found:
                meta[rule["target_label"]] = found.expand(rule.get("replacement", "$1").replace("$", "\\"))
        ports = [p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])]
        assert meta["__address__"] == f"10.1.2.3:{annotations['prometheus.io/port']}"
        assert int(annotations["prometheus.io/port"]) in ports
        jobs.add(meta["job"])
    assert jobs == {"rft-synchronizer", "rft-buffer", "rft-trainer", "rft-explorer"}
