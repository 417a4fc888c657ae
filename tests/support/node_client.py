"""The Node.js example client (examples/clients/node) for the tests that run it: `node` from PATH and the
client's pinned npm dependencies, installed with `npm ci` into its git-ignored node_modules when they are
missing or older than its package-lock.json (a clean clone has none), and one run of `client.js`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support.file_lock import file_lock

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "examples" / "clients" / "node"


def node_client() -> tuple[str | None, str]:
    """(the `node` binary, "") ready to run client.js, or (None, why not): no node, or no npm to install the
    dependencies with, or `npm ci` failed (its output's tail)."""
    node = shutil.which("node")
    if node is None:
        return None, "`node` is not on PATH (install Node.js >= 18)"
    with file_lock(CLIENT_DIR / ".npm-ci.lock"):  # test workers may ask at once
        return _installed(node)


def _installed(node: str) -> tuple[str | None, str]:
    installed = CLIENT_DIR / "node_modules" / ".package-lock.json"
    lock = CLIENT_DIR / "package-lock.json"
    if installed.is_file() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return node, ""
    npm = shutil.which("npm")
    if npm is None:
        return None, "its dependencies are not installed and `npm` is not on PATH"
    done = subprocess.run(
        [npm, "ci", "--prefix", str(CLIENT_DIR), "--no-audit", "--no-fund", "--loglevel=error"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        return None, f"`npm ci --prefix examples/clients/node` failed: {(done.stdout + done.stderr)[-2000:]}"
    return node, ""


def run_client(
    node: str, *args: str, deadline_ms: int = 15000, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """`node examples/clients/node/client.js --deadline-ms D ARGS`, its output captured."""
    return subprocess.run(
        [node, str(CLIENT_DIR / "client.js"), "--deadline-ms", str(deadline_ms), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
