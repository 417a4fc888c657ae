"""A service whose Prometheus metrics port is taken (a socket this test holds open) exits 1 before it
serves, with one line on stderr naming the port and the setting, as for a gRPC port in use: no
traceback. The same for TLS files that cannot be read."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.support.rft_run import ROOT, env


def _buffer(config_text: str, tmp_path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "run.yaml"
    config.write_text(config_text)
    return subprocess.run(
        [sys.executable, "-m", "services.buffer", "--config", str(config), "--port-file", str(tmp_path / "port")],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_busy_metrics_port_is_a_one_line_startup_error(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = _buffer(f"services:\n  buffer: {{store: memory, metrics_port: {port}}}\n", tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    expected = (
        f"buffer: metrics port {port} on 127.0.0.1 is in use; set services.buffer.metrics_port "
        "(or RFT_BUFFER_METRICS_PORT) to a free port, 0 for any free port or -1 for no metrics endpoint"
    )
    assert proc.stderr.strip().splitlines()[-1] == expected, proc.stderr
    assert not (tmp_path / "port").exists()  # it never served


def test_an_unreadable_tls_file_is_a_one_line_startup_error(tmp_path):
    missing = tmp_path / "server.pem"
    key = tmp_path / "server.key"
    key.write_text("not a key\n")
    proc = _buffer(f"services:\n  tls: {{cert_file: {missing}, key_file: {key}}}\n", tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    expected = f"buffer: services.tls.cert_file '{missing}' cannot be read: No such file or directory"
    assert proc.stderr.strip().splitlines()[-1] == expected, proc.stderr
