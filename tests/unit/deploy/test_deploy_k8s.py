"""The Kubernetes manifests (deploy/k8s, GPU overlay deploy/k8s-gpu) checked against the code, without a
cluster: every service runs a real module with the mounted run config; each listens (config + the pod's
RFT_* environment) on the port its container, probes and Service name; the environment holds only names
the code reads; peers are found by Service DNS names; explorers scale and take the pod name as id; the
trainer is a Job that does not run again after a finished run; Redis keeps an fsynced AOF on a PVC; pods
run as the image's non-root user; the GPU overlay requests the GPUs Trinity-RFT's placement gives.

With kubectl installed (scripts/setup.sh installs Debian's kubernetes-client) it also renders the
kustomizations and runs `kubectl apply --dry-run=client --validate=false -k` against a discovery stub
(tests/support/kube_api_stub.py: a client-side dry run still needs an API server to name the kinds)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import load_config
from services.common.config.gpus import gpu_demand, place_gpus
from services.common.config.loader import ENV_OVERRIDES
from tests.support.kube_api_stub import KubeApiStub

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
GPU = ROOT / "deploy" / "k8s-gpu"
RFT_SERVICES = ("synchronizer", "buffer", "trainer", "explorer")
CONFIG = "/etc/rft/run.yaml"
POD_IP = "10.1.2.3"
# Environment names the manifests set that are not RFT overrides: the downward-API helper the others
# expand ($(POD_IP)) and the OpenMP thread count torch reads.
NOT_RFT_ENV = {"POD_IP", "OMP_NUM_THREADS"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def objects(kustomization) -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of the base, by (kind, name)."""
    out = {}
    for name in kustomization["resources"]:
        for doc in _docs(K8S / name):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _generator(kustomization, kind: str, name: str) -> dict[str, Any]:
    (gen,) = [g for g in kustomization[kind] if g["name"] == name]
    return gen


def _literals(kustomization) -> dict[str, str]:
    literals = _generator(kustomization, "configMapGenerator", "rft-env")["literals"]
    return dict(item.split("=", 1) for item in literals)


def _secret_example() -> dict[str, str]:
    lines = (K8S / "secret.env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def _workload(objects, service: str) -> dict[str, Any]:
    return objects[("Job" if service == "trainer" else "Deployment", service)]


def _pod(objects, service: str) -> dict[str, Any]:
    return _workload(objects, service)["spec"]["template"]["spec"]


def _container(objects, service: str) -> dict[str, Any]:
    (container,) = _pod(objects, service)["containers"]
    return container


def _environment(kustomization, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env with $(VAR)
    expanded (the downward-API fields get fake values)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            assert source["configMapRef"]["name"] == "rft-env"
            env.update(_literals(kustomization))
        else:
            assert source["secretRef"]["name"] == "rft-auth"
            env.update(_secret_example())
    fields = {"status.podIP": POD_IP, "metadata.name": "explorer-7d9f8-x2k4q"}
    for item in container.get("env", []):
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], item["value"])
    return env


def _loaded(kustomization, objects, service: str, overrides=()):
    """The config the service's container loads: run.yaml, its --set arguments, its environment."""
    container = _container(objects, service)
    args = container["args"]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"] + list(overrides)
    return load_config(K8S / "run.yaml", overrides=sets, environ=_environment(kustomization, container))


def _port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


def _image_uid(dockerfile: Path) -> int:
    match = re.search(r"useradd [^\n]*--uid (\d+) (\w+)", dockerfile.read_text())
    assert match, f"{dockerfile.name} creates no non-root user"
    assert re.search(rf"^USER {match.group(2)}$", dockerfile.read_text(), re.M)
    return int(match.group(1))


# ---------------------------------------------------------------------------------------------- structure
def test_the_stack_has_every_object(objects, kustomization):
    assert set(objects) == {
        ("Namespace", "rft-mesh"),
        ("PersistentVolumeClaim", "rft-data"),
        ("Service", "redis"), ("StatefulSet", "redis"),
        ("Service", "synchronizer"), ("Deployment", "synchronizer"),
        ("Service", "buffer"), ("Deployment", "buffer"),
        ("Service", "trainer"), ("Job", "trainer"),
        ("Deployment", "explorer"),
    }  # fmt: skip
    assert kustomization["namespace"] == "rft-mesh"
    for (kind, _), obj in objects.items():
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rft-mesh", kind


def test_commands_run_real_modules_with_the_mounted_config(kustomization, objects):
    assert _generator(kustomization, "configMapGenerator", "rft-run-config")["files"] == ["run.yaml"]
    for service in RFT_SERVICES:
        container = _container(objects, service)
        assert container["command"] == ["python", "-m", f"services.{service}"], service
        assert (ROOT / "services" / service / "__main__.py").is_file()
        assert container["args"][:2] == ["--config", CONFIG]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["config"]["mountPath"] == str(Path(CONFIG).parent) and mounts["config"]["readOnly"]
        volumes = {v["name"]: v for v in _pod(objects, service)["volumes"]}
        assert volumes["config"]["configMap"]["name"] == "rft-run-config"
        assert container["image"] == "rft-mesh:cpu"


def test_the_run_config_runs_by_itself_on_redis(kustomization, objects):
    config = _loaded(kustomization, objects, "trainer")
    assert config.mode == "both" and config.trainer.auto_start and config.explorer.auto_start
    assert config.services.buffer.store == "redis"
    assert config.checkpoint_root_dir.startswith("/data/") and config.model.model_path.startswith("/data/")


# ------------------------------------------------------------------------------------ ports, probes, DNS
def test_each_service_listens_where_its_container_probes_and_service_say(kustomization, objects):
    for service in RFT_SERVICES:
        container = _container(objects, service)
        endpoint = getattr(_loaded(kustomization, objects, service).services, service)
        port = _port(container, "grpc")
        assert endpoint.port == port, service
        assert endpoint.host == "0.0.0.0", service
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": port}, (service, probe)  # native gRPC probes
        assert endpoint.metrics_port == _port(container, "metrics")
        annotations = _workload(objects, service)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(endpoint.metrics_port)
        if service != "explorer":  # explorers are dialled at their pod IP, not through a Service
            svc = objects[("Service", service)]["spec"]
            assert svc["ports"] == [{"name": "grpc", "port": port, "targetPort": "grpc"}]
            labels = _workload(objects, service)["spec"]["template"]["metadata"]["labels"]
            assert svc["selector"].items() <= labels.items()
            # the trainer's name is its pod's IP (every port: the nccl rendezvous), like a compose name
            assert (svc.get("clusterIP") == "None") == (service == "trainer"), service


def test_services_find_each_other_by_service_dns_names(kustomization, objects):
    for service in RFT_SERVICES:
        s = _loaded(kustomization, objects, service).services
        assert s.auth_token == _secret_example()["RFT_AUTH_TOKEN"]
        for peer in ("buffer", "trainer", "synchronizer"):
            endpoint = getattr(s, peer)
            host, port = endpoint.target.rsplit(":", 1)
            assert host == peer and ("Service", host) in objects, (service, peer)
            assert int(port) == objects[("Service", peer)]["spec"]["ports"][0]["port"] == endpoint.port
        url = re.fullmatch(r"redis://(\w+):(\d+)/0", s.buffer.redis_url)
        assert url and ("Service", url.group(1)) in objects
        redis = objects[("Service", url.group(1))]["spec"]
        assert redis["ports"][0]["port"] == int(url.group(2)) and redis["clusterIP"] == "None"
        assert objects[("StatefulSet", "redis")]["spec"]["serviceName"] == url.group(1)


def test_every_environment_name_is_one_the_code_reads(kustomization, objects):
    source = "\n".join(p.read_text() for p in (ROOT / "services").rglob("*.py"))
    names = set(_literals(kustomization)) | set(_secret_example())
    for service in RFT_SERVICES:
        names |= {e["name"] for e in _container(objects, service).get("env", [])}
    unknown = {n for n in names - NOT_RFT_ENV if n not in ENV_OVERRIDES and f'"{n}"' not in source}
    assert not unknown, f"set in the manifests but read nowhere in services/: {sorted(unknown)}"
    assert all(n.startswith("RFT_") for n in names - NOT_RFT_ENV)


def test_explorers_scale_and_take_the_pod_name_as_id(kustomization, objects):
    explorer = _workload(objects, "explorer")
    assert explorer["kind"] == "Deployment" and explorer["spec"]["replicas"] == 1
    container = _container(objects, "explorer")
    assert all("hostPort" not in p for p in container["ports"])
    env = {e["name"]: e for e in container["env"]}
    assert env["RFT_EXPLORER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_IP") < names.index("RFT_EXPLORER_ADDRESS")  # $(POD_IP) expands
    config = _loaded(kustomization, objects, "explorer")
    assert config.services.explorer.target == f"{POD_IP}:{_port(container, 'grpc')}"
    explorer_source = (ROOT / "services" / "explorer" / "service.py").read_text()
    assert 'os.environ.get("RFT_EXPLORER_ID")' in explorer_source


# ------------------------------------------------------------------------------------- trainer and redis
def test_the_trainer_is_one_job_that_ends_with_the_run(objects):
    job = _workload(objects, "trainer")["spec"]
    assert (job["completions"], job["parallelism"]) == (1, 1)
    assert job["template"]["spec"]["restartPolicy"] == "OnFailure"  # crashes restart, exit 0 ends
    assert job["backoffLimit"] >= 1 and job["podReplacementPolicy"] == "Failed"
    assert job["template"]["spec"]["terminationGracePeriodSeconds"] >= 120  # the stop saves
    for service in ("buffer", "synchronizer"):
        deployment = _workload(objects, service)["spec"]
        assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
    assert objects[("Service", "trainer")]["spec"]["publishNotReadyAddresses"] is True


def test_the_trainer_ranks_come_from_trainer_nproc(objects):
    """The Job runs the plain `python -m services.trainer`, which becomes torchrun with trainer.nproc
    ranks by itself (tests/unit/trainer/test_trainer_main.py); the pod needs no torchrun line."""
    assert _container(objects, "trainer")["command"] == ["python", "-m", "services.trainer"]
    main = (ROOT / "services" / "trainer" / "__main__.py").read_text()
    assert "nproc, nnodes = _trainer_shape(argv)" in main and "torchrun_command(nproc, argv, place)" in main


def test_redis_keeps_an_fsynced_append_only_file_on_a_volume(objects):
    redis = objects[("StatefulSet", "redis")]["spec"]
    (container,) = redis["template"]["spec"]["containers"]
    assert container["image"].split(":") == ["redis", "7"]
    command = container["command"]
    assert command[0] == "redis-server" and command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"
    data_dir = command[command.index("--dir") + 1]
    (claim,) = redis["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": data_dir} in container["volumeMounts"]
    assert redis["replicas"] == 1
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["redis-cli", "ping"]


@pytest.mark.slow  # writes the tiny model (~8 s)
def test_the_shared_volume_holds_the_model_tasks_and_checkpoints(kustomization, objects, tmp_path):
    """The trainer pod's `prepare` step writes what run.yaml names under /data; the explorers' wait
    finds it (their init script runs here against a copy, /data -> a temporary folder)."""
    claim = objects[("PersistentVolumeClaim", "rft-data")]["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"]
    for service in ("trainer", "explorer", "synchronizer"):
        volumes = {v["name"]: v for v in _pod(objects, service)["volumes"]}
        assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "rft-data"
        assert {"name": "data", "mountPath": "/data"} in _container(objects, service)["volumeMounts"]
    (prepare,) = _pod(objects, "trainer")["initContainers"]
    assert prepare["command"] == ["python", "deploy/prepare.py", "/data"]
    spec = importlib.util.spec_from_file_location("deploy_prepare", ROOT / "deploy" / "prepare.py")
    prepare_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare_module)
    prepare_module.prepare(tmp_path, rows=16)
    run_copy = tmp_path / "run.yaml"
    run_copy.write_text((K8S / "run.yaml").read_text().replace("/data/", f"{tmp_path}/"))
    (wait,) = _pod(objects, "explorer")["initContainers"]
    assert wait["command"] == ["python", "-c"]
    script = wait["args"][0].replace(CONFIG, str(run_copy)).replace("600", "0")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (tmp_path / "tasks" / "arithmetic.jsonl").unlink()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "arithmetic.jsonl" in done.stderr


def test_the_buffer_waits_for_redis(objects):
    (wait,) = _pod(objects, "buffer")["initContainers"]
    assert wait["command"] == ["python", "-c"] and "RFT_REDIS_URL" in wait["args"][0]
    compile(wait["args"][0], "wait-for-redis", "exec")


# ------------------------------------------------------------------------------- security and resources
def _all_pods(objects):
    for (kind, name), obj in objects.items():
        if kind in ("Deployment", "StatefulSet", "Job"):
            yield name, obj["spec"]["template"]["spec"]


def test_a_hung_service_fails_its_liveness_probe_and_is_killed_at_once(objects):
    """The gRPC liveness probe is answered by the service's event loop: a stopped or wedged process fails
    it. After the window `rft run` uses (`services.liveness_timeout`, 120 s) the kubelet restarts the
    container, with a probe-level grace of seconds, not the pod's (a stopped process never acts on
    SIGTERM; the trainer's 180 s are for a graceful stop's checkpoint)."""
    default = load_config(K8S / "run.yaml", environ={}).services.liveness_timeout
    for name in RFT_SERVICES:
        pod = _pod(objects, name)
        container = pod["containers"][0]
        probe = container["livenessProbe"]
        assert probe["grpc"]["port"] == container["readinessProbe"]["grpc"]["port"], name
        window = probe["periodSeconds"] * probe["failureThreshold"]
        assert window == default, (name, window)
        assert probe["timeoutSeconds"] < probe["periodSeconds"], name
        assert probe["terminationGracePeriodSeconds"] <= 15, name
        assert probe["terminationGracePeriodSeconds"] < pod["terminationGracePeriodSeconds"], name
        assert "startupProbe" in container, f"{name}: a long model load is the startup probe's to judge"


def test_pods_run_as_the_images_non_root_user(objects):
    uid = _image_uid(ROOT / "deploy" / "Dockerfile")
    assert _image_uid(ROOT / "deploy" / "Dockerfile.gpu") == uid
    for name, pod in _all_pods(objects):
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True, name
        expected = 999 if name == "redis" else uid  # redis:7 runs as its `redis` user, uid 999
        assert context["runAsUser"] == context["fsGroup"] == expected, name
        for container in pod["containers"] + pod.get("initContainers", []):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_every_container_requests_resources(objects):
    for name, pod in _all_pods(objects):
        for container in pod["containers"] + pod.get("initContainers", []):
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), (name, container["name"])
            assert "memory" in resources["limits"], (name, container["name"])


def test_the_token_is_a_secret_kept_out_of_git(kustomization, objects):
    generator = _generator(kustomization, "secretGenerator", "rft-auth")
    assert generator == {"name": "rft-auth", "env": "secret.env"}  # `env:`, which kustomize v2 reads too
    assert set(_secret_example()) == {"RFT_AUTH_TOKEN"}
    assert "secret.env" in (K8S / ".gitignore").read_text().split()
    for service in RFT_SERVICES:
        assert {"secretRef": {"name": "rft-auth"}} in _container(objects, service)["envFrom"]


# ------------------------------------------------------------------------------------------- GPU overlay
@pytest.fixture(scope="module")
def gpu_overlay() -> dict[str, Any]:
    overlay = yaml.safe_load((GPU / "kustomization.yaml").read_text())
    patches = {}
    for entry in overlay["patches"]:
        if "target" not in entry:
            (doc,) = _docs(GPU / entry["path"])
            patches[doc["metadata"]["name"]] = doc
    return {"kustomization": overlay, "patches": patches}


def _gpu_sets() -> list[str]:
    ops = yaml.safe_load((GPU / "run-gpu.yaml").read_text())
    assert all(op["op"] == "add" and op["path"] == "/spec/template/spec/containers/0/args/-" for op in ops)
    values = [op["value"] for op in ops]
    assert values[::2] == ["--set"] * (len(values) // 2)
    return values[1::2]


def test_the_gpu_overlay_sets_the_same_config_for_every_service(gpu_overlay):
    overlay = gpu_overlay["kustomization"]
    assert overlay["resources"] == ["../k8s"]
    targets = [e["target"] for e in overlay["patches"] if "target" in e]
    assert {"kind": "Job", "name": "trainer"} in targets
    assert {"kind": "Deployment", "labelSelector": "app.kubernetes.io/part-of=rft-mesh"} in targets
    config = load_config(K8S / "run.yaml", overrides=_gpu_sets(), environ={})
    assert config.cluster.gpu_per_node > 0 and config.explorer.rollout_model.engine_type == "vllm"


def test_the_gpu_overlay_requests_the_gpus_of_the_placement(gpu_overlay):
    config = load_config(K8S / "run.yaml", overrides=_gpu_sets(), environ={})
    placement = place_gpus(config.cluster.node_num * config.cluster.gpu_per_node, gpu_demand(config))
    wanted = {"explorer": len(placement.explorers[0]), "trainer": len(placement.trainer)}
    assert wanted["trainer"] >= config.trainer.nproc
    for name, gpus in wanted.items():
        patch = gpu_overlay["patches"][name]
        pod = patch["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        resources = container["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == gpus, name
        assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {"rft-mesh:gpu"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert {v["name"] for v in pod["volumes"]} == {"shm"}


# --------------------------------------------------------------------------------------------- docs
def test_docs_says_how_to_apply_and_that_no_cluster_ran():
    readme = (ROOT / "docs" / "kubernetes.md").read_text()
    for needle in ("kubectl apply -k deploy/k8s", "deploy/k8s-gpu", "secret.env", "No cluster"):
        assert needle in readme, needle


# ---------------------------------------------------------------------------------------------- kubectl
def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(
            "!!! kubectl is not installed: the kustomize render and `kubectl apply --dry-run=client -k` "
            "of deploy/k8s were SKIPPED (apt-get install kubernetes-client; scripts/setup.sh does)"
        )
    return kubectl


def _kustomize_version(kubectl: str) -> tuple[int, ...]:
    done = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=30)
    match = re.search(r"Kustomize Version: v(\d+)\.(\d+)", done.stdout)
    return tuple(int(x) for x in match.groups()) if match else (2, 0)  # kubectl <= 1.20: v2.0.3


@pytest.fixture(scope="module")
def deploy_copy(tmp_path_factory) -> Path:
    """deploy/k8s and deploy/k8s-gpu with secret.env made from the example (as a user does)."""
    root = tmp_path_factory.mktemp("deploy")
    for src in (K8S, GPU):
        shutil.copytree(src, root / src.name, ignore=shutil.ignore_patterns("secret.env"))
    shutil.copy(K8S / "secret.env.example", root / "k8s" / "secret.env")
    return root


def _render(kubectl: str, folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}


def _dry_run(kubectl: str, folder: Path, tmp_path: Path) -> str:
    with KubeApiStub.start() as stub:
        done = subprocess.run(
            [kubectl, "--kubeconfig", str(stub.kubeconfig(tmp_path)), "apply", "--dry-run=client",
             "--validate=false", "-k", str(folder)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kubectl_renders_the_base_with_generated_names(deploy_copy):
    rendered = _render(_kubectl(), deploy_copy / "k8s")
    generated = {name.rsplit("-", 1)[0]: name for kind, name in rendered if kind in ("ConfigMap", "Secret")}
    assert set(generated) == {"rft-env", "rft-run-config", "rft-auth"}
    for (kind, name), obj in rendered.items():
        assert kind == "Namespace" or obj["metadata"]["namespace"] == "rft-mesh", name
    pod = rendered[("Job", "trainer")]["spec"]["template"]["spec"]
    assert {"configMapRef": {"name": generated["rft-env"]}} in pod["containers"][0]["envFrom"]
    assert pod["volumes"][0]["configMap"]["name"] == generated["rft-run-config"]
    assert yaml.safe_load(rendered[("ConfigMap", generated["rft-run-config"])]["data"]["run.yaml"]) == (
        yaml.safe_load((K8S / "run.yaml").read_text())
    )


def test_kubectl_apply_dry_run_accepts_the_base(deploy_copy, tmp_path):
    out = _dry_run(_kubectl(), deploy_copy / "k8s", tmp_path)
    for obj in ("namespace/rft-mesh", "statefulset.apps/redis", "deployment.apps/explorer", "job.batch/trainer",
                "persistentvolumeclaim/rft-data", "service/trainer"):  # fmt: skip
        assert f"{obj} created (dry run)" in out, out


def test_kubectl_renders_and_dry_runs_the_gpu_overlay(deploy_copy, tmp_path):
    kubectl = _kubectl()
    if _kustomize_version(kubectl) < (4, 0):
        pytest.skip(
            "!!! this kubectl's kustomize is older than v4 (kubectl <= 1.20, e.g. Debian's kubernetes-client): "
            "it cannot read deploy/k8s-gpu (`resources: [dir]`, `patches:`); the overlay's structural "
            "tests above still ran"
        )
    rendered = _render(kubectl, deploy_copy / "k8s-gpu")
    config = load_config(K8S / "run.yaml", overrides=_gpu_sets(), environ={})
    placement = place_gpus(config.cluster.gpu_per_node, gpu_demand(config))
    for kind, name, gpus in (("Job", "trainer", placement.trainer),
                             ("Deployment", "explorer", placement.explorers[0])):  # fmt: skip
        (container,) = rendered[(kind, name)]["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == len(gpus)
        assert container["image"] == "rft-mesh:gpu"
    for kind, name in (("Job", "trainer"), ("Deployment", "explorer"), ("Deployment", "buffer"),
                       ("Deployment", "synchronizer")):  # fmt: skip
        args = rendered[(kind, name)]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args == ["--config", CONFIG] + [x for s in _gpu_sets() for x in ("--set", s)], name
    assert "job.batch/trainer created (dry run)" in _dry_run(kubectl, deploy_copy / "k8s-gpu", tmp_path)
