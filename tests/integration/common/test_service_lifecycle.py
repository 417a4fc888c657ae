"""A service process (`python -m services.buffer`) serves health, then stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]


def _wait_for_file(path: Path, proc: subprocess.Popen, deadline_s: float = 60.0) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if path.exists():
            return path.read_text()
        if proc.poll() is not None:
            raise AssertionError(f"service exited early: {proc.communicate()[1]}")
        time.sleep(0.05)  # ok-sleep: polling a file with a deadline
    raise AssertionError("service did not start in time")


def test_sigterm_stops_gracefully(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("services:\n  buffer: {store: memory}\nlog: {format: json}\n")
    port_file = tmp_path / "port"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.buffer", "--config", str(cfg), "--port-file", str(port_file)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(_wait_for_file(port_file, proc))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert '"event": "stopped"' in err
