"""`rft top` against a real run, read off a real terminal: a short quickstart-like `rft run` (the tiny
model, one stage) is watched by `rft top JOB_DIR` in a tmux session, whose screen is captured until it
shows the four services answering, the trainer past step 0 and a reward sparkline; `rft top CONFIG
--once` (the job found from the run config) prints the same frame once and exits. The same live
services' `/metrics` carry every `rft_*` series deploy/prometheus's rules read."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import urllib.request
import uuid

import pytest

from tests.support.rft_run import ROOT, env, example, poll_until, start_rft, tiny_model, write_config

pytestmark = pytest.mark.slow

SERVICES = ("synchronizer", "buffer", "trainer", "explorer")
SPARK = re.compile(r"reward [▁▂▃▄▅▆▇█]{2,}")


def _rows(screen: str) -> dict[str, str]:
    """The services table's rows by service name."""
    rows = {}
    for line in screen.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 4 and cells[1] in SERVICES and cells[1] not in rows:
            rows[cells[1]] = line
    return rows


def _trainer_step(screen: str) -> int:
    found = re.search(r"(\d+) trainer step", screen)
    return int(found.group(1)) if found else 0


def _scraped(run_dir) -> set[str]:
    ports = {p.name: int(p.read_text()) for p in run_dir.glob("*.metrics_port")}
    assert len(ports) == len(SERVICES), ports
    names = set()
    for port in ports.values():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            names |= {line.split("{")[0].split(" ")[0] for line in reply.read().decode().splitlines()}
    return names


def _read_by_rules() -> set[str]:
    rules = (ROOT / "deploy" / "prometheus" / "rules").glob("*.yml")
    return set(re.findall(r"\b(rft_[a-z_]+)\b", "".join(p.read_text() for p in rules)))


def _shows_the_run(screen: str) -> bool:
    rows = _rows(screen)
    up = all(" up " in rows.get(name, "") for name in SERVICES)
    return up and _trainer_step(screen) > 0 and bool(SPARK.search(screen))


@pytest.mark.timeout(300)
def test_rft_top_shows_a_live_run_in_a_terminal(tmp_path):
    tree = example("quickstart.yaml")
    tree.pop("stages")
    tree.update(checkpoint_root_dir=str(tmp_path / "ckpt"), continue_from_checkpoint=False)
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"].update(batch_size=2, total_steps=500)  # stopped by the test once seen
    tree["trainer"].update(save_interval=0, save_hf_checkpoint="never")
    tree["explorer"]["eval_on_startup"] = False
    tree["monitor"] = {"monitor_type": "none"}
    for name in SERVICES:  # `rft run` picks free ports and writes them to run/<name>.metrics_port
        tree.setdefault("services", {}).setdefault(name, {})["metrics_port"] = 9090
    config = write_config(tmp_path / "run.yaml", tree)
    job = tmp_path / "ckpt" / "quickstart" / "arithmetic"
    log = tmp_path / "rft.log"
    # a tmux server of its own; the view takes its width from the pane (160), not an inherited COLUMNS
    tmux = ["tmux", "-L", f"rft-top-{uuid.uuid4().hex[:8]}"]
    proc = start_rft(config, log=log)
    try:
        poll_until(lambda: (job / "run" / "trainer.port").is_file() or proc.poll() is not None, 180,
                   "the trainer's port file")  # fmt: skip
        assert proc.poll() is None, log.read_text()[-3000:]
        top = [sys.executable, "-m", "launcher.cli", "top", str(job), "--interval", "0.5"]
        command = (
            f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(env()['PYTHONPATH'])} "
            + shlex.join(top)
        )
        subprocess.run([*tmux, "new-session", "-d", "-x", "160", "-y", "50", command], check=True)
        screen = ""

        def capture() -> bool:
            nonlocal screen
            assert proc.poll() is None, log.read_text()[-3000:]
            out = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True)
            screen = out.stdout
            return _shows_the_run(screen)

        try:
            poll_until(capture, 150, "rft top to show the run", interval_s=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last screen:\n{screen}") from None
        assert f"rft top  job {job}  " in screen  # one line: the pane is 160 columns wide
        assert "restarts" in screen and "explorers" in screen and "pipeline" in screen
        assert re.search(r"step time [0-9.]+ s", screen) and re.search(r"pg_loss -?[0-9.]", screen), screen
        once = subprocess.run([sys.executable, "-m", "launcher.cli", "top", str(config), "--once"],
                              cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)  # fmt: skip
        assert once.returncode == 0, once.stdout + once.stderr
        assert f"job {job}" in once.stdout and _shows_the_run(once.stdout), once.stdout
        missing = _read_by_rules() - _scraped(job / "run")
        assert not missing, f"series the alert rules read that the live services do not serve: {missing}"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
