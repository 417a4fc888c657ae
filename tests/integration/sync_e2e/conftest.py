"""A whole run as separate processes: synchronizer, buffer, trainer and two explorers on the tiny
model (CPU, gloo), each started with `python -m services.<name>` as `rft run` would start them, with
`trainer.auto_start` and `explorer.auto_start` so the run drives itself.

`RunHarness` writes the run config, starts the processes (in parallel where it can), and reads what
they leave behind: the synchronizer's event history (`<job_dir>/synchronizer/events.jsonl`) and the
JSON log lines of each process (`weights sent` / `weights loaded`, with SHA-256 digests because
`synchronizer.weight_digest` is on). Waits poll files with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launcher.tiny_model import make_tiny_model
from services.explorer.workflows.arithmetic import make_arithmetic_rows

ROOT = Path(__file__).resolve().parents[3]
POLL_S = 0.02


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, procs=()) -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout` or if a process died."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for p in procs:
            if not p.killed and p.proc.poll() not in (None, 0):
                raise AssertionError(
                    f"{p.name} exited with {p.proc.returncode} while waiting for {what}:\n{p.tail()}"
                )
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_S)  # ok-sleep: polling files with a deadline


class Proc:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.killed = False
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [x for x in self.lines() if x.get("event") == name]

    def tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {timeout:g}s:\n{self.tail()}") from None

    def kill(self) -> None:
        self.killed = True
        self.proc.kill()

    def stop(self, end: float) -> None:
        """Wait for the process (SIGTERM sent) until `end`, then kill it."""
        try:
            self.proc.wait(max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class RunHarness:
    def __init__(self, root: Path, model: Path):
        self.root, self.model = root, model
        self.taskset = root / "arith.jsonl"
        self.job_dir = root / "ckpt" / "proj" / "run"
        self.procs: dict[str, Proc] = {}
        self.env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }

    # ---- config and processes ----------------------------------------------------------------
    def write_config(
        self,
        method: str,
        *,
        steps_per_explorer: int,
        offset: int = 0,
        interval: int = 1,
        sync_timeout: float = 120,
        heartbeat_timeout: float = 6,
        fanout: int = 0,
        wire_dtype: str = "auto",
        train_batch_size: int = 0,
    ) -> Path:
        """Each of the two explorers gets `steps_per_explorer` steps of data (its shard of the
        taskset); no `total_steps`, so the run ends when the data does and the trainer drained it.
        `train_batch_size` 8 makes each trainer step take a step of both explorers (lockstep)."""
        rows = make_arithmetic_rows(2 * 2 * steps_per_explorer, seed=3)  # 2 explorers x batch_size 2
        self.taskset.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cfg = self.root / "run.yaml"
        cfg.write_text(
            f"""
project: proj
name: run
checkpoint_root_dir: {self.root}/ckpt
model: {{model_path: {self.model}, max_response_tokens: 4}}
algorithm:
  algorithm_type: grpo
  repeat_times: 2
  optimizer: {{lr: 1.0e-3, weight_decay: 0.0}}
  kl_loss_fn: none
buffer:
  batch_size: 2
  train_batch_size: {train_batch_size}
  explorer_input:
    taskset: {{name: arith, path: {self.taskset}, default_workflow_type: arithmetic,
               format: {{prompt_key: question, response_key: answer}},
               rollout_args: {{max_tokens: 4}}}}
explorer: {{auto_start: true, runner_per_model: 4, eval_on_startup: false}}
trainer: {{auto_start: true, use_dynamic_bsz: false, micro_batch_size_per_gpu: 4, save_hf_checkpoint: last}}
synchronizer:
  sync_method: {method}
  sync_style: fixed
  sync_interval: {interval}
  sync_offset: {offset}
  sync_timeout: {sync_timeout}
  heartbeat_timeout: {heartbeat_timeout}
  weight_digest: true
  fanout: {fanout}
  wire_dtype: {wire_dtype}
monitor: {{monitor_type: none}}
log: {{format: json}}
"""
        )
        self.config = cfg
        return cfg

    def _port_file(self, name: str) -> Path:
        return self.root / f"{name}.port"

    def start(self, name: str, module: str, *extra: str, env: dict[str, str] | None = None) -> Proc:
        args = [f"services.{module}", "--config", str(self.config), *extra]
        if module in ("synchronizer", "buffer"):
            args += ["--port-file", str(self._port_file(name))]
        proc = Proc(name, args, {**self.env, **(env or {})}, self.root)
        self.procs[name] = proc
        return proc

    def start_core(self) -> None:
        """Synchronizer and buffer, until both serve; their addresses go to the others by env."""
        self.start("synchronizer", "synchronizer")
        self.start("buffer", "buffer")
        sync_port, buffer_port = (
            wait_until(
                lambda n=n: self._port_file(n).is_file() and self._port_file(n).read_text(),
                60,
                f"{n} port",
                [self.procs[n]],
            )  # fmt: skip
            for n in ("synchronizer", "buffer")
        )
        self.env["RFT_SYNCHRONIZER_ADDRESS"] = f"127.0.0.1:{sync_port}"
        self.env["RFT_BUFFER_ADDRESS"] = f"127.0.0.1:{buffer_port}"

    def start_trainer(self) -> Proc:
        return self.start("trainer", "trainer")

    def start_explorer(self, i: int, name: str | None = None) -> Proc:
        return self.start(
            name or f"explorer-{i}", "explorer", "--explorer-id", f"explorer-{i}", "--shard", f"{i}/2"
        )

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGCONT)
                proc.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 15
        for proc in self.procs.values():
            proc.stop(end)

    # ---- what the run left behind ----------------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        path = self.job_dir / "synchronizer" / "events.jsonl"
        if not path.is_file():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]

    def wait_event(self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict:
        return wait_until(
            lambda: next((e for e in self.events() if predicate(e)), None), timeout, what, self.procs.values()
        )

    def sent(self) -> dict[int, str]:
        """Trainer: version -> digest of the weights it sent."""
        return {x["version"]: x["digest"] for x in self.procs["trainer"].events("weights sent")}

    @staticmethod
    def loaded(proc: Proc) -> dict[int, str]:
        """Explorer process: version -> digest of the weights its engine holds after loading."""
        return {x["version"]: x["digest"] for x in proc.events("weights loaded")}


def held_before_steps(events: list[dict[str, Any]], member: str, steps: int) -> dict[int, int]:
    """From the synchronizer's history: the version `member` held when each explore step began.

    An explorer reports a load (`reported`, detail `ok`) between steps; the event's `step` is the
    number of steps it had finished, so the load applies from step `step + 1` on.
    """
    loads = [
        (e["step"], e["version"])
        for e in events
        if e["kind"] == "reported" and e["member_id"] == member and e["detail"].startswith("ok")
    ]
    return {s: max((v for k, v in loads if k <= s - 1), default=0) for s in range(1, steps + 1)}


@pytest.fixture
def run(tmp_path, tiny_model):
    harness = RunHarness(tmp_path, tiny_model)
    yield harness
    harness.stop_all()
