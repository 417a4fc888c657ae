"""The Node.js client (`examples/clients/node/client.js`, @grpc/grpc-js reading protos/ at run time) against
real service processes: it pushes whole groups into the buffer, leases and acks them back, reads the run
state from the synchronizer, and the buffer's Stats agree. What it pushes decodes in Python as valid
Experiences (the trainer's view). A wrong token fails with exit 1 and stores nothing.

Its README's instructions, as they are: `rft serve buffer|synchronizer` with the compose stack's config
(`deploy/config/run.yaml`, on a real redis-server; environment overrides only for addresses, ports, the
token and the Redis URL, as compose passes them) and the client with the README's arguments alone. Its
group (`node-client`) is declared there, and its acks delete nothing the trainer's group still holds.

The client's npm dependencies are installed (`npm ci --prefix examples/clients/node`) when missing; skips
(loudly) only when `node`, or `npm` to install them with, is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from rft.v1 import buffer_pb2, buffer_pb2_grpc

from services.common.experience import from_proto
from tests.support.node_client import node_client
from tests.support.redis_server import RedisServer, require_redis_server

ROOT = Path(__file__).resolve().parents[3]
CLIENT_DIR = ROOT / "examples" / "clients" / "node"
COMPOSE_CONFIG = ROOT / "deploy" / "config" / "run.yaml"
TOKEN = "node-client-secret"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def _require_node() -> str:
    """`node`, with the client's dependencies installed (`npm ci`) when they are missing."""
    node, why = node_client()
    if node is None:
        pytest.skip(f"NODE CLIENT NOT TESTED: {why}")
    return node


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path
    port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _start(
    name: str, config: Path, workdir: Path, env: dict[str, str] | None = None, rft: bool = False
) -> Service:
    """Start service `name` (with `rft`: as `rft serve NAME`, the README's command) and wait for its port."""
    port_file = workdir / f"{name}.port"
    log = workdir / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "protos")]), **(env or {})}
    command = [sys.executable, "-m", f"services.{name}"]
    if rft:
        command = [sys.executable, "-m", "launcher.cli", "serve", name]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*command, "--config", str(config), "--port-file", str(port_file)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    service = Service(name, proc, log)
    end = time.monotonic() + 120
    while not port_file.exists():
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}:\n{service.log_tail()}")
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError(f"{name} did not start in 120 s:\n{service.log_tail()}")
        time.sleep(0.05)  # ok-sleep: polling the port file with a deadline
    service.port = int(port_file.read_text())
    return service


def _stop(service: Service) -> None:
    if service.proc.poll() is None:
        service.proc.send_signal(signal.SIGTERM)
        try:
            service.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.proc.kill()
            service.proc.wait()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("node_client")
    (workdir / "run.yaml").write_text(
        f"""
project: node-client
name: test
checkpoint_root_dir: {workdir}/checkpoints
mode: both
algorithm: {{repeat_times: 4}}
synchronizer: {{sync_method: memory, sync_style: fixed, sync_interval: 2}}
monitor: {{monitor_type: none}}
log: {{format: json}}
services:
  buffer: {{store: memory, consumer_groups: [default, node-client]}}
  auth_token: {TOKEN}
"""
    )
    return workdir


def _service(name: str, workdir: Path) -> Iterator[Service]:
    service = _start(name, workdir / "run.yaml", workdir)
    try:
        yield service
    finally:
        _stop(service)


@pytest.fixture(scope="module")
def buffer(workdir) -> Iterator[Service]:
    yield from _service("buffer", workdir)


@pytest.fixture(scope="module")
def synchronizer(workdir) -> Iterator[Service]:
    yield from _service("synchronizer", workdir)


def _run_client(node: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node, str(CLIENT_DIR / "client.js"), "--deadline-ms", "15000", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _stats(address: str, consumer_group: str = "") -> buffer_pb2.StatsResponse:
    with grpc.insecure_channel(address) as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        return stub.Stats(buffer_pb2.StatsRequest(consumer_group=consumer_group), metadata=AUTH, timeout=10)


def _summary(done: subprocess.CompletedProcess[str], *services: Service) -> dict:
    logs = "\n".join(f"--- {s.name}\n{s.log_tail()}" for s in services)
    assert done.returncode == 0, f"client failed:\n{done.stderr}\n{logs}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_client_pushes_leases_acks_and_reads_the_run_state(buffer, synchronizer):
    node = _require_node()
    before = _stats(buffer.address, "node-client")
    done = _run_client(
        node, "--buffer", buffer.address, "--synchronizer", synchronizer.address, "--token", TOKEN,
        "--groups", "3", "--group-size", "4", "--stream",
    )  # fmt: skip
    summary = _summary(done, buffer, synchronizer)
    assert summary["ok"] is True
    assert summary["put"] == {"rpc": "PutExperiences", "accepted": 12, "batches": 3, "duplicates": 0}
    assert summary["ours_back"] == 12 and summary["groups_back"] == 3
    assert summary["acked"] == summary["leased"] >= 12
    assert summary["stats_after"]["accepted"] - summary["stats_before"]["accepted"] == 12

    after = _stats(buffer.address, "node-client")
    assert after.accepted - before.accepted == 12
    assert after.acked - before.acked == summary["acked"]
    assert after.pending_leases == 0 and after.pending_experiences == 0
    assert after.rejected == before.rejected

    state = summary["run_state"]
    assert state["sync_method"] == "memory" and state["sync_style"] == "fixed" and state["sync_interval"] == 2
    assert state["model_version"] == 0 and state["finished"] is False
    assert isinstance(state["members"], list)


def test_what_node_pushes_is_a_valid_experience_for_the_trainer(buffer):
    node = _require_node()
    done = _run_client(
        node, "--buffer", buffer.address, "--token", TOKEN, "--no-consume",
        "--groups", "2", "--group-size", "3", "--prompt-length", "6", "--response-length", "5",
        "--model-version", "7", "--producer-id", "node-producer",
    )  # fmt: skip
    summary = _summary(done, buffer)
    assert summary["put"]["rpc"] == "Put" and summary["put"]["accepted"] == 6 and "run_state" not in summary

    # Lease them as the trainer does (the default consumer group), decode, check, ack.
    with grpc.insecure_channel(buffer.address) as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        leased = stub.GetBatch(
            buffer_pb2.GetBatchRequest(size=6, timeout_ms=5000, min_model_version=7),
            metadata=AUTH,
            timeout=10,
        )
        exps = [from_proto(e) for e in leased.experiences]
        ack = stub.Ack(buffer_pb2.AckRequest(lease_id=leased.lease_id), metadata=AUTH, timeout=10)
    assert len(exps) == 6 and ack.acked == 6
    assert sorted(Counter(e.eid.group_id for e in exps).values()) == [3, 3]
    for e in exps:
        assert e.eid.group_id.startswith(summary["run_tag"]) and e.eid.explorer_id == "node-producer"
        assert e.prompt_length == 6 and e.response_length == 5 and len(e.tokens) == 11
        assert e.logprobs.shape == e.action_mask.shape == (5,) and bool(e.action_mask.all())
        assert (e.logprobs <= 0).all() and e.reward is not None and 0.0 <= e.reward <= 1.0
        assert e.model_version == 7


def test_wrong_token_fails_with_exit_1_and_stores_nothing(buffer):
    node = _require_node()
    before = _stats(buffer.address)
    done = _run_client(node, "--buffer", buffer.address, "--token", "wrong")
    assert done.returncode == 1, done.stdout
    failure = json.loads(done.stderr.strip().splitlines()[-1])
    assert failure["ok"] is False and failure["code"] == "UNAUTHENTICATED"
    assert _stats(buffer.address).accepted == before.accepted


def test_bad_usage_exits_2():
    node = _require_node()
    done = _run_client(node, "--groups", "3")
    assert done.returncode == 2 and "--buffer HOST:PORT is required" in done.stderr


@pytest.fixture(scope="module")
def compose_services(tmp_path_factory) -> Iterator[tuple[Service, Service]]:
    """Buffer and synchronizer serving `deploy/config/run.yaml` unchanged, on a real redis-server; the
    environment moves them to free loopback ports, as compose's `RFT_*` overrides move them."""
    require_redis_server()
    workdir = tmp_path_factory.mktemp("node_client_compose")
    env = {"RFT_AUTH_TOKEN": TOKEN}
    for name in ("buffer", "synchronizer"):
        key = f"RFT_{name.upper()}_"
        env |= {key + "HOST": "127.0.0.1", key + "PORT": "0", key + "METRICS_PORT": "0"}
    with RedisServer.start() as redis_server:
        env["RFT_REDIS_URL"] = redis_server.url
        started: list[Service] = []
        try:
            for name in ("buffer", "synchronizer"):
                started.append(_start(name, COMPOSE_CONFIG, workdir, env, rft=True))
            yield started[0], started[1]
        finally:
            for service in started:
                _stop(service)


def test_the_readme_run_against_the_compose_config(compose_services):
    """docs/compose.md and the client's README: `node examples/clients/node/client.js --buffer ...
    --synchronizer ... --token ...` against the compose stack's config, nothing else set."""
    node = _require_node()
    buffer, synchronizer = compose_services
    done = _run_client(
        node, "--buffer", buffer.address, "--synchronizer", synchronizer.address, "--token", TOKEN
    )
    summary = _summary(done, buffer, synchronizer)
    assert summary["consumer_group"] == "node-client" and summary["stats_after"]["store"] == "redis"
    assert summary["ours_back"] == 8 and summary["groups_back"] == 2 and summary["acked"] == summary["leased"]
    assert summary["run_state"]["sync_method"] == "memory"

    # The node-client group's acks deleted nothing: the trainer's group (`default`) still holds every
    # experience until it acks them itself; then they are gone.
    assert _stats(buffer.address, "default").size == summary["stats_after"]["size"] >= 8
    with grpc.insecure_channel(buffer.address) as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        leased = stub.GetBatch(buffer_pb2.GetBatchRequest(size=8, timeout_ms=5000), metadata=AUTH, timeout=10)
        assert len(leased.experiences) == 8
        assert {e.eid.group_id for e in leased.experiences} == {
            f"{summary['run_tag']}-g{g}" for g in range(2)
        }
        stub.Ack(buffer_pb2.AckRequest(lease_id=leased.lease_id), metadata=AUTH, timeout=10)
    assert _stats(buffer.address, "default").size == 0

    # An experience pushed but not yet read by node-client stays until that group reads it.
    pushed = _summary(_run_client(node, "--buffer", buffer.address, "--token", TOKEN, "--no-consume"), buffer)
    with grpc.insecure_channel(buffer.address) as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        leased = stub.GetBatch(buffer_pb2.GetBatchRequest(size=8, timeout_ms=5000), metadata=AUTH, timeout=10)
        stub.Ack(buffer_pb2.AckRequest(lease_id=leased.lease_id), metadata=AUTH, timeout=10)
    assert pushed["put"]["accepted"] == 8 and _stats(buffer.address, "default").size == 8
    again = _summary(_run_client(node, "--buffer", buffer.address, "--token", TOKEN), buffer)
    assert again["leased"] == 16 and again["stats_after"]["size"] == 8  # its own 8 are held by `default`


def test_the_compose_config_declares_the_group_the_readme_names():
    config = yaml.safe_load(COMPOSE_CONFIG.read_text())
    readme = (CLIENT_DIR / "README.md").read_text()
    assert "node-client" in config["services"]["buffer"]["consumer_groups"]
    assert "default" in config["services"]["buffer"]["consumer_groups"]  # the trainer's
    assert "`node-client`" in readme and "consumer_groups" in readme


# Ack with a 10,000-character lease id from @grpc/grpc-js; prints the status name and the details' length.
HUGE_ACK_JS = """
const path = require('node:path');
const [address, clientDir, token] = process.argv.slice(1);
const grpc = require(path.join(clientDir, 'node_modules', '@grpc', 'grpc-js'));
const loader = require(path.join(clientDir, 'node_modules', '@grpc', 'proto-loader'));
const def = loader.loadSync(['rft/v1/buffer.proto'], { includeDirs: [path.join(clientDir, '..', '..', '..', 'protos')], keepCase: true });
const stub = new (grpc.loadPackageDefinition(def).rft.v1.BufferService)(address, grpc.credentials.createInsecure());
const md = new grpc.Metadata();
md.set('authorization', `Bearer ${token}`);
stub.Ack({ lease_id: 'L'.repeat(10000) }, md, { deadline: Date.now() + 10000 }, (err) => {
  process.stdout.write(JSON.stringify({ code: err ? grpc.status[err.code] : 'OK', details: err ? err.details : '' }));
  stub.close();
});
"""


def test_a_huge_lease_id_reaches_node_as_a_short_invalid_argument(buffer):
    node = _require_node()
    done = subprocess.run(
        [node, "-e", HUGE_ACK_JS, buffer.address, str(CLIENT_DIR), TOKEN],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["code"] == "INVALID_ARGUMENT", reply["code"]
    assert reply["details"].startswith("lease_id:") and "10000 characters" in reply["details"]
    assert len(reply["details"]) < 400


def test_a_backlog_of_its_group_drains_in_few_leases(buffer):
    """The client's group sees every stored experience: a backlog (here 400 pushed without consuming)
    comes back in large leases (`--lease-size`, default 512), not `--groups x --group-size` at a time."""
    node = _require_node()
    backlog = _run_client(
        node, "--buffer", buffer.address, "--token", TOKEN, "--no-consume", "--groups", "100"
    )
    assert _summary(backlog, buffer)["put"]["accepted"] == 400
    summary = _summary(_run_client(node, "--buffer", buffer.address, "--token", TOKEN), buffer)
    assert summary["ours_back"] == 8 and summary["leased"] >= 408
    assert summary["leases"] <= 2, summary


def test_client_speaks_mutual_tls_and_a_client_without_a_certificate_is_refused(tmp_path):
    """A buffer with mutual TLS (`services.tls.client_auth`): the client with the CA and a client
    certificate round-trips its groups; with the CA alone it fails (exit 1) and the buffer stores nothing."""
    from tests.support.tls_certs import Pki

    node = _require_node()
    pki = Pki.create(tmp_path / "pki")
    server, client = pki.server("buffer"), pki.client("node-client")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "project": "node-client", "name": "tls", "checkpoint_root_dir": str(tmp_path / "checkpoints"),
        "monitor": {"monitor_type": "none"}, "log": {"format": "json"},
        "services": {
            "auth_token": TOKEN,
            "buffer": {"store": "memory", "consumer_groups": ["default", "node-client"]},
            "tls": {"cert_file": str(server.cert_file), "key_file": str(server.key_file),
                    "ca_file": str(pki.ca_file), "client_auth": True},
        },
    }))  # fmt: skip
    buffer = _start("buffer", config, tmp_path)
    try:
        tls = ["--ca-file", str(pki.ca_file)]
        refused = _run_client(node, "--buffer", f"localhost:{buffer.port}", "--token", TOKEN, *tls)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert json.loads(refused.stderr.strip().splitlines()[-1])["ok"] is False
        done = _run_client(
            node, "--buffer", f"localhost:{buffer.port}", "--token", TOKEN, *tls,
            "--cert-file", str(client.cert_file), "--key-file", str(client.key_file), "--groups", "2",
        )  # fmt: skip
        summary = _summary(done, buffer)
        assert summary["put"]["accepted"] == 8 and summary["ours_back"] == 8  # nothing of the refused run
        assert summary["acked"] == summary["leased"] == 8
        usage = _run_client(node, "--buffer", "localhost:1", *tls, "--cert-file", str(client.cert_file))
        assert usage.returncode == 2 and "--cert-file and --key-file go together" in usage.stderr
    finally:
        _stop(buffer)
