"""The Kubernetes serve-mode overlay (deploy/k8s-serve over deploy/k8s) checked against the code, without a
cluster: it replaces the run config every pod mounts with a serve-mode one that loads (with the pods'
environment) as the compose stack's deploy/config/serve.yaml does; the explorer's container names the
endpoint's port, which Service explorer-serve selects and the readiness probe asks (GET /health); the
explorer rolls out with no second endpoint beside it. With kubectl (its kustomize v4 or newer) it also
renders the overlay and runs `kubectl apply --dry-run=client -k` against the discovery stub
(tests/support/kube_api_stub.py), as tests/unit/deploy/test_deploy_k8s.py does for the base."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import load_config, resolve
from tests.support.kube_api_stub import KubeApiStub

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
SERVE = ROOT / "deploy" / "k8s-serve"
RFT_SERVICES = ("synchronizer", "buffer", "trainer", "explorer")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def overlay() -> dict[str, Any]:
    return yaml.safe_load((SERVE / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def _pod_env(base) -> dict[str, str]:
    """What every RFT pod gets from ConfigMap rft-env and Secret rft-auth (made from its example)."""
    (gen,) = [g for g in base["configMapGenerator"] if g["name"] == "rft-env"]
    env = dict(item.split("=", 1) for item in gen["literals"])
    lines = (K8S / "secret.env.example").read_text().splitlines()
    env.update(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    return env


def _explorer_deployment() -> dict[str, Any]:
    (doc,) = [d for d in _docs(K8S / "explorer.yaml") if d["kind"] == "Deployment"]
    return doc


def _apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The `add` (also `/-`) and `replace` operations of RFC 6902 that the overlay's patch uses."""
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [int(p) if p.isdigit() else p for p in op["path"].strip("/").split("/")]
        node = out
        for part in parents:
            node = node[part]
        if op["op"] == "add" and last == "-":
            node.append(op["value"])
        else:
            assert op["op"] in ("add", "replace"), op
            if op["op"] == "replace":
                assert (last < len(node)) if isinstance(node, list) else (last in node), op["path"]
            node[last] = op["value"]
    return out


@pytest.fixture(scope="module")
def explorer(overlay) -> dict[str, Any]:
    """The explorer Deployment of the overlay: the base one with the overlay's patch applied."""
    (patch,) = [p for p in overlay["patches"] if p.get("target", {}).get("name") == "explorer"]
    assert patch["target"] == {"kind": "Deployment", "name": "explorer"}
    return _apply_json_patch(_explorer_deployment(), yaml.safe_load((SERVE / patch["path"]).read_text()))


def test_the_overlay_is_the_base_with_a_serve_config_and_the_endpoints_service(overlay, base):
    assert overlay["resources"] == ["../k8s", "explorer-service.yaml"]
    assert overlay["namespace"] == base["namespace"]  # the new Service lands beside the rest
    (gen,) = overlay["configMapGenerator"]
    assert gen == {"name": "rft-run-config", "behavior": "replace", "files": ["run.yaml"]}
    (base_gen,) = [g for g in base["configMapGenerator"] if g["name"] == "rft-run-config"]
    assert base_gen["files"] == ["run.yaml"]  # same key, so every pod's mount reads the serve config
    assert "secretGenerator" not in overlay  # the token is the base's Secret rft-auth


def test_the_serve_config_loads_as_each_pod_sees_it(base):
    env = _pod_env(base)
    config = load_config(SERVE / "run.yaml", environ=env)
    training = load_config(K8S / "run.yaml", environ=env)
    assert config.mode == "serve" and config.trainer.auto_start
    assert config.services == training.services  # addresses, Redis store, token: the pods' environment
    assert config.services.buffer.store == "redis" and config.services.auth_token
    assert config.model.model_path == training.model.model_path  # what the trainer's prepare step writes
    assert config.checkpoint_root_dir == training.checkpoint_root_dir
    assert resolve(config).tasksets == []  # the explorer's wait-for-data init waits for the model only
    assert (config.explorer.serve.host, config.explorer.serve.port) == ("0.0.0.0", 8000)


def test_the_serve_config_is_the_compose_one_but_for_addresses():
    """deploy/k8s-serve/run.yaml and deploy/config/serve.yaml run the same serve-mode run."""
    k8s = yaml.safe_load((SERVE / "run.yaml").read_text())
    compose = yaml.safe_load((ROOT / "deploy" / "config" / "serve.yaml").read_text())
    assert {k: v for k, v in k8s.items() if k != "services"} == {
        k: v for k, v in compose.items() if k != "services"
    }  # fmt: skip


def test_the_explorer_serves_on_the_port_its_service_and_probe_name(explorer):
    config = load_config(SERVE / "run.yaml", environ={})
    spec = explorer["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    (container,) = spec["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == config.explorer.serve.port and len(set(ports.values())) == len(ports)
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert set(container["readinessProbe"]) == {"httpGet", "periodSeconds", "timeoutSeconds"}
    for probe in ("startupProbe", "livenessProbe"):  # the gRPC server, as in the base
        assert container[probe]["grpc"] == {"port": ports["grpc"]}
    app = (ROOT / "services" / "explorer" / "serve" / "openai_app.py").read_text()
    assert '@app.get("/health")' in app


def test_the_endpoints_service_selects_the_explorer_only(explorer):
    (service,) = _docs(SERVE / "explorer-service.yaml")
    assert service["kind"] == "Service" and service["metadata"]["name"] == "explorer-serve"
    assert service["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rft-mesh"
    spec = service["spec"]
    assert spec["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}]
    assert spec.get("type", "ClusterIP") == "ClusterIP"  # reached by port-forward, Ingress or a patch
    assert spec["selector"].items() <= explorer["spec"]["template"]["metadata"]["labels"].items()
    for name in ("synchronizer", "buffer", "trainer"):
        for doc in _docs(K8S / f"{name}.yaml"):
            if doc["kind"] in ("Deployment", "Job"):
                assert not spec["selector"].items() <= doc["spec"]["template"]["metadata"]["labels"].items()


def test_docs_says_how_to_apply_and_reach_the_endpoint():
    readme = (ROOT / "docs" / "serve.md").read_text()
    for needle in ("kubectl apply -k deploy/k8s-serve", "port-forward service/explorer-serve"):
        assert needle in readme, needle


# ---------------------------------------------------------------------------------------------- kubectl
def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("!!! kubectl is not installed: the render and dry run of deploy/k8s-serve were SKIPPED "
                    "(apt-get install kubernetes-client; scripts/setup.sh does)")  # fmt: skip
    done = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=30)
    match = re.search(r"Kustomize Version: v(\d+)\.(\d+)", done.stdout)
    if not match or (int(match.group(1)), int(match.group(2))) < (4, 0):
        pytest.skip("!!! this kubectl's kustomize is older than v4: it cannot read deploy/k8s-serve "
                    "(`resources: [dir]`, `patches:`); the overlay's structural tests above still ran")  # fmt: skip
    return kubectl


@pytest.fixture(scope="module")
def deploy_copy(tmp_path_factory) -> Path:
    """deploy/k8s and deploy/k8s-serve with secret.env made from the example (as a user does)."""
    root = tmp_path_factory.mktemp("deploy")
    for src in (K8S, SERVE):
        shutil.copytree(src, root / src.name, ignore=shutil.ignore_patterns("secret.env"))
    shutil.copy(K8S / "secret.env.example", root / "k8s" / "secret.env")
    return root


def test_kubectl_renders_the_overlay(deploy_copy):
    done = subprocess.run(
        [_kubectl(), "kustomize", str(deploy_copy / "k8s-serve")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}
    configs = [name for kind, name in rendered if kind == "ConfigMap" and name.startswith("rft-run-config-")]
    assert len(configs) == 1, configs  # replaced, not added
    data = rendered[("ConfigMap", configs[0])]["data"]["run.yaml"]
    assert yaml.safe_load(data) == yaml.safe_load((SERVE / "run.yaml").read_text())
    for kind, name in (("Job", "trainer"), *(("Deployment", s) for s in RFT_SERVICES if s != "trainer")):
        volumes = {v["name"]: v for v in rendered[(kind, name)]["spec"]["template"]["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == configs[0], name
    for (kind, name), obj in rendered.items():
        assert kind == "Namespace" or obj["metadata"]["namespace"] == "rft-mesh", name
    (container,) = rendered[("Deployment", "explorer")]["spec"]["template"]["spec"]["containers"]
    assert {"name": "http", "containerPort": 8000} in container["ports"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert rendered[("Service", "explorer-serve")]["spec"]["ports"][0]["targetPort"] == "http"


def test_kubectl_apply_dry_run_accepts_the_overlay(deploy_copy, tmp_path):
    kubectl = _kubectl()
    with KubeApiStub.start() as stub:
        done = subprocess.run(
            [kubectl, "--kubeconfig", str(stub.kubeconfig(tmp_path)), "apply", "--dry-run=client",
             "--validate=false", "-k", str(deploy_copy / "k8s-serve")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for obj in ("service/explorer-serve", "deployment.apps/explorer", "job.batch/trainer"):
        assert f"{obj} created (dry run)" in done.stdout, done.stdout
