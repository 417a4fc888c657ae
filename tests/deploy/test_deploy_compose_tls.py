"""The compose stack with mutual TLS on a real Docker engine: deploy/docker-compose.yml plus
deploy/docker-compose.tls.yml, with certificates made by the test (a CA; one service certificate for
both ends, named for the compose peers and 127.0.0.1; a client certificate for the host) and the shipped
deploy/config/run.yaml changed in `trainer.total_steps`, `save_interval` and `services.tls.client_auth`.

Every RFT service serves TLS and requires client certificates; their healthchecks (run inside each
container, reading RFT_TLS_* as the override sets them) pass, so the trainer, which waits for a healthy
buffer and synchronizer, starts, trains over mutual TLS to `total_steps` and exits 0. From the host the
buffer's published port answers the health probe with the CA and a client certificate, and refuses a
plaintext probe and one without a certificate, each saying why. `down -v` leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.compose_stack import DEPLOY, ROOT, Stack, free_ports, wait_for
from tests.support.docker_engine import CACHE, Engine
from tests.support.tls_certs import Pki

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

JOB = "/data/checkpoints/rft-mesh/compose"
TOTAL_STEPS = 6


def _tls_dir(tmp: Path) -> tuple[Path, Pki]:
    """ca.pem, service.pem, service.key as docker-compose.tls.yml wants them, readable by uid 1000."""
    folder = tmp / "tls"
    pki = Pki.create(folder)
    cert = pki.server("service", client_too=True, names=("buffer", "synchronizer", "trainer", "explorer"))
    assert cert.key_file == folder / "service.key"
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)
    return folder, pki


def _stack(engine: Engine, images: dict[str, str], tmp: Path, tls_dir: Path) -> Stack:
    config = yaml.safe_load((DEPLOY / "config" / "run.yaml").read_text())
    config["trainer"].update(total_steps=TOTAL_STEPS, save_interval=3)
    config["services"]["tls"] = {"client_auth": True}  # the files come from RFT_TLS_* (the override)
    (tmp / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    names = ("BUFFER_PORT", "EXPLORER_PORT", "TRAINER_PORT", "SYNCHRONIZER_PORT")
    ports = dict(zip(names, free_ports(4), strict=True))
    env = {
        "RFT_AUTH_TOKEN": "deploy-tls-token",
        **{k: str(v) for k, v in ports.items()},
        "PUBLISH_HOST": "127.0.0.1",
        "RFT_IMAGE": images["RFT_IMAGE"],
        "REDIS_IMAGE": images["REDIS_IMAGE"],
        "RFT_RUN_CONFIG": str(tmp / "run.yaml"),
        "RFT_TLS_DIR": str(tls_dir),
        "OMP_NUM_THREADS": "1",
    }
    env_file = tmp / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    files = ("docker-compose.yml", "docker-compose.tls.yml")
    return Stack(engine, "rftdeploytesttls", env_file, env, files=files, job=JOB)


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "services.common.healthcheck", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.timeout(900)
def test_compose_stack_with_mutual_tls_trains_to_the_end(engine, images, tmp_path):
    tls_dir, pki = _tls_dir(tmp_path)
    stack = _stack(engine, images, tmp_path, tls_dir)
    seen = stack.seen
    start = time.monotonic()
    stack.compose("down", "-v", "--remove-orphans")
    try:
        _run(stack, pki, seen)
    except BaseException:
        stack.dump_logs(CACHE / "failed-tls")
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans")
    left = stack.leftovers()
    seen["wall_s"] = round(time.monotonic() - start)
    (CACHE / "last-tls.json").write_text(json.dumps(seen, indent=1))
    assert not left, f"`down -v` left {left}"


def _run(stack: Stack, pki: Pki, seen: dict) -> None:
    t0 = time.monotonic()
    stack.compose("up", "-d", "--scale", "explorer=1")
    for service in ("synchronizer", "buffer"):  # their healthchecks run over mutual TLS in the container
        wait_for(f"{service} healthy", lambda s=service: stack.health(s) == "healthy", 240, stack.describe)
    seen["healthy_s"] = round(time.monotonic() - t0)

    buffer = f"127.0.0.1:{stack.env['BUFFER_PORT']}"
    client = pki.client("host")
    ca = ["--ca-file", str(pki.ca_file)]
    ok = _probe(buffer, "--timeout", "10", *ca, "--cert-file", str(client.cert_file), "--key-file",
                str(client.key_file))  # fmt: skip
    assert ok.returncode == 0 and ok.stdout.strip() == f"{buffer}: SERVING", ok.stderr
    plain = _probe(buffer, "--timeout", "5")
    assert plain.returncode == 1 and "serves TLS and this client dials plaintext" in plain.stderr, (
        plain.stderr
    )
    no_cert = _probe(buffer, "--timeout", "5", *ca)
    assert no_cert.returncode == 1, no_cert.stderr
    assert "the server requires a client certificate and this client presented none" in no_cert.stderr
    seen["host_probes"] = {"mutual": ok.stdout.strip(), "plaintext": plain.stderr.strip()[-200:]}

    wait_for("the trainer to finish", lambda: stack.state("trainer")[0] == "exited", 420, stack.describe)
    status, code, restarts = stack.state("trainer")
    assert (status, code, restarts) == ("exited", 0, 0), stack.describe()
    finished = [
        json.loads(line) for line in stack.logs(stack.one("trainer")).splitlines()
        if '"run finished"' in line and line.startswith("{")
    ]  # fmt: skip
    assert finished and finished[-1]["reason"] == "total_steps reached", stack.describe()
    assert finished[-1]["step"] == TOTAL_STEPS
    assert [r["step"] for r in stack.trainer_rows()] == list(range(1, TOTAL_STEPS + 1))
    seen.update(final_step=finished[-1]["step"], run_s=round(time.monotonic() - t0))
