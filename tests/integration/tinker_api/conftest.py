"""A `rft serve tinker` subprocess on a free port, on the repository's tiny model, for the SDK tests.

Base model `tiny` trains a LoRA adapter, `tiny-full` (the same folder) every weight; one torch thread.
The same folder is also served as `Qwen/Qwen3-8B-Base`, the hub name `tinker-cookbook`'s sl_loop is
given (test_tinker_cookbook.py): the cookbook picks its renderer from that name.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.rft_run import ROOT, env, poll_until, tiny_model

API_KEY = "tml-rft-test"
COOKBOOK_MODEL = "Qwen/Qwen3-8B-Base"


def start_server(work: Path, port: int = 0, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m tinker_api` on `port` (0: a free one), checkpoints under `work`; `extra` arguments
    (e.g. the service-backed mode's `--synchronizer`, `--explorer`)."""
    folder = tiny_model()
    port_file = work / "port"
    port_file.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "tinker_api", "--port", str(port), "--port-file", str(port_file),
        "--api-key", API_KEY, "--base-model", f"tiny={folder}", "--base-model", f"tiny-full={folder}",
        "--base-model", f"{COOKBOOK_MODEL}={folder}", "--full", "tiny-full", "--threads", "1",
        "--checkpoint-dir", str(work / "checkpoints"), *extra,
    ]  # fmt: skip
    with (work / "server.log").open("ab") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
    poll_until(
        lambda: port_file.is_file() and port_file.read_text() or proc.poll() is not None, 120, "the server"
    )
    assert proc.poll() is None, (work / "server.log").read_text()
    url = f"http://127.0.0.1:{port_file.read_text()}"
    assert httpx.get(f"{url}/api/v1/healthz").json() == {"status": "ok"}
    return proc, url


@pytest.fixture(scope="package")
def tinker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_server(tmp_path_factory.mktemp("tinker"))
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()
