"""`rft run` with mutual TLS on (certificates made by the test): every service serves TLS and requires a
client certificate signed by the run's CA, every client presents one (the services to each other, the
weights through the synchronizer, `rft run`'s own health and liveness checks), and the run reaches
`total_steps`. While it runs, the buffer refuses a plaintext probe and a probe without a client
certificate, each saying why, and answers one with the CA and a certificate."""

from __future__ import annotations

import json

import pytest

from services.common.healthcheck import main as probe
from tests.support.rft_run import (
    assert_no_orphans,
    example,
    poll_until,
    run_rft,
    start_rft,
    tiny_model,
    write_config,
)
from tests.support.tls_certs import Pki

pytestmark = pytest.mark.slow

STEPS = 3


def _probe(args: list[str], capsys) -> tuple[int, str]:
    code = probe(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_rft_run_with_mutual_tls_reaches_total_steps(tmp_path, capsys):
    pki = Pki.create(tmp_path / "pki")
    cert = pki.server("service", client_too=True)  # one certificate for both ends of every service
    client = pki.client("probe")
    tree = example("quickstart.yaml")
    tree.pop("stages")
    tree.update(checkpoint_root_dir=str(tmp_path / "ckpt"), continue_from_checkpoint=False)
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"].update(batch_size=2, total_steps=STEPS)
    tree["trainer"].update(save_interval=0, save_hf_checkpoint="never")
    tree["monitor"] = {"monitor_type": "none"}
    tree["services"] = {
        "tls": {
            "cert_file": str(cert.cert_file),
            "key_file": str(cert.key_file),
            "ca_file": str(pki.ca_file),
            "client_auth": True,
        }
    }
    log = tmp_path / "rft.log"
    proc = start_rft(write_config(tmp_path / "run.yaml", tree), log=log)
    job = tmp_path / "ckpt" / "quickstart" / "arithmetic"
    try:
        port_file = job / "run" / "buffer.port"
        port = poll_until(
            lambda: port_file.is_file() and port_file.read_text().strip(), 120, "the buffer's port"
        )
        target = f"127.0.0.1:{port}"
        ca = ["--ca-file", str(pki.ca_file)]
        code, out = _probe([target, "--timeout", "10", *ca, "--cert-file", str(client.cert_file),
                            "--key-file", str(client.key_file)], capsys)  # fmt: skip
        assert code == 0 and f"{target}: SERVING" in out, out
        code, out = _probe([target, "--timeout", "5"], capsys)
        assert code == 1 and "serves TLS and this client dials plaintext" in out, out
        code, out = _probe([target, "--timeout", "5", *ca], capsys)
        assert (
            code == 1 and "the server requires a client certificate and this client presented none" in out
        ), out
        assert proc.wait(timeout=240) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert_no_orphans(output)
    assert f"buffer ready at {target}" in output
    summary = json.loads((job / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == STEPS, summary
    trained = [
        json.loads(line)["step"] for line in (job / "metrics" / "trainer.jsonl").read_text().splitlines()
    ]
    assert trained == list(range(1, STEPS + 1))
    # the services were told to serve TLS with client certificates (the config every process read)
    effective = (job / "config.yaml").read_text()
    assert "client_auth: true" in effective and str(cert.cert_file) in effective


def test_rft_run_with_tls_but_no_ca_file_is_refused_before_anything_starts(tmp_path):
    pki = Pki.create(tmp_path / "pki")
    cert = pki.server()
    tree = example("quickstart.yaml")
    tree.pop("stages")
    tree.update(checkpoint_root_dir=str(tmp_path / "ckpt"))
    tree["model"]["model_path"] = str(tiny_model())
    tree["services"] = {"tls": {"cert_file": str(cert.cert_file), "key_file": str(cert.key_file)}}
    proc = run_rft(write_config(tmp_path / "run.yaml", tree), timeout_s=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "services.tls.cert_file is set but services.tls.ca_file is not" in proc.stderr
    assert not (tmp_path / "ckpt").exists()
