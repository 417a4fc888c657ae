"""`python -m services.synchronizer --config X.yaml` serves the run state, then stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from rft.v1 import synchronizer_pb2, synchronizer_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]


def test_synchronizer_process_serves_run_state_and_stops(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "synchronizer:\n  sync_method: checkpoint\n  sync_style: fixed\n  sync_interval: 2\n  sync_offset: 1\n"
        "log: {format: json}\n"
    )
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.synchronizer", "--config", str(cfg), "--port-file", str(port_file)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < end, "synchronizer did not start in time"
            time.sleep(0.05)  # ok-sleep: polling a file with a deadline
        with grpc.insecure_channel(f"127.0.0.1:{port_file.read_text()}") as ch:
            state = synchronizer_pb2_grpc.SynchronizerServiceStub(ch).GetRunState(
                synchronizer_pb2.GetRunStateRequest(), timeout=10
            )
        assert (state.sync_method, state.sync_style, state.sync_interval, state.sync_offset) == (
            "checkpoint", "fixed", 2, 1,
        )  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and '"event": "stopped"' in err
