"""The multi-node trainer overlay (deploy/k8s-multinode) rendered by kubectl's kustomize and checked against
the code without a cluster: the trainer is an indexed Job of `trainer.nnodes` pods; each pod's node rank is
its completion index and node 0's address is its hostname under the headless Service, as
services/trainer/nodes.py reads them; the Service `trainer` reaches node 0 only (global rank 0 serves gRPC);
only node 0 probes gRPC and writes the shared volume; `kubectl apply --dry-run=client` accepts it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import load_config
from services.trainer.nodes import node_place
from tests.support.kube_api_stub import KubeApiStub

ROOT = Path(__file__).resolve().parents[3]
K8S, OVERLAY = ROOT / "deploy" / "k8s", ROOT / "deploy" / "k8s-multinode"


@pytest.fixture(scope="module")
def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip(
            "!!! kubectl is not installed: the multi-node overlay render was SKIPPED (scripts/setup.sh)"
        )
    return found


@pytest.fixture(scope="module")
def deploy_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deploy")
    for src in (K8S, OVERLAY):
        shutil.copytree(src, root / src.name, ignore=shutil.ignore_patterns("secret.env"))
    shutil.copy(K8S / "secret.env.example", root / "k8s" / "secret.env")
    return root


@pytest.fixture(scope="module")
def rendered(kubectl, deploy_copy) -> dict[tuple[str, str], dict[str, Any]]:
    done = subprocess.run([kubectl, "kustomize", str(deploy_copy / OVERLAY.name)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}


def _sets(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--set"]


def test_the_trainer_is_an_indexed_job_of_nnodes_pods(rendered):
    job = rendered[("Job", "trainer")]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    config = load_config(K8S / "run.yaml", overrides=_sets(container["args"]), environ={})
    nnodes = config.trainer.nnodes
    assert nnodes == 2
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nnodes


def test_each_pod_finds_its_place_as_the_trainer_reads_it(rendered):
    job = rendered[("Job", "trainer")]
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    service = rendered[("Service", pod["subdomain"])]
    # an indexed Job's pod k is named <job>-k, resolvable as <hostname>.<subdomain> under a headless Service
    assert env["RFT_TRAINER_MASTER_ADDR"] == f"{job['metadata']['name']}-0.{pod['subdomain']}"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    place = node_place(job["spec"]["completions"], {**env, "JOB_COMPLETION_INDEX": "1"})
    assert (place.node_rank, place.master_port) == (1, int(env["RFT_TRAINER_MASTER_PORT"]))
    ports = {p["containerPort"] for p in pod["containers"][0]["ports"]}
    assert place.master_port in ports


def test_the_trainer_service_reaches_node_0_only(rendered):
    selector = rendered[("Service", "trainer")]["spec"]["selector"]
    assert selector["batch.kubernetes.io/job-completion-index"] == "0"
    assert selector["app.kubernetes.io/component"] == "trainer"


def test_only_node_0_probes_grpc_and_writes_the_volume(rendered):
    pod = rendered[("Job", "trainer")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = container[probe]
        assert "grpc" not in spec, probe
        script = spec["exec"]["command"][-1]
        assert script.startswith('[ "$JOB_COMPLETION_INDEX" != 0 ] ||') and "127.0.0.1:50053" in script, probe
    (prepare,) = pod["initContainers"]
    assert prepare["command"][-1].startswith('[ "$JOB_COMPLETION_INDEX" != 0 ] ||')
    assert "deploy/prepare.py /data" in prepare["command"][-1]


def test_kubectl_apply_dry_run_accepts_the_overlay(kubectl, deploy_copy, tmp_path):
    with KubeApiStub.start() as stub:
        done = subprocess.run(
            [kubectl, "--kubeconfig", str(stub.kubeconfig(tmp_path)), "apply", "--dry-run=client",
             "--validate=false", "-k", str(deploy_copy / OVERLAY.name)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "job.batch/trainer created (dry run)" in done.stdout
