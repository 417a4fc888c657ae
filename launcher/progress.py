"""Progress of a running stage, read from the metrics files the services write
(`metrics/explorer*.jsonl`, `metrics/trainer.jsonl`; one JSON object per step).

`MetricsTail` follows one file (only whole lines, from where it stopped). `Progress` keeps the latest
numbers and renders them: a live rich table on a terminal, a plain log line per new trainer step
(at most one every `plain_interval_s`) otherwise.

The files outlive processes: a resumed run finds the lines of the one before, and a restarted trainer
rewinds to its checkpoint and writes those steps again. So the step shown is the last line's (not the
largest ever seen), and the ETA is the rate of the steps written since the current process started:
measured from the newest step of the first poll that read lines, measured anew when the step goes
back or a process was restarted (`restarted()`), never from lines that were already there.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


class MetricsTail:
    """New JSON lines of a file that another process appends to."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return MetricsTail(path).read_new()


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


class Progress:
    """Latest step, reward, tokens/s, model_version and ETA of one stage."""

    def __init__(self, job_dir: Path, label: str, total_steps: int | None, stream: TextIO | None = None,
                 live: bool | None = None, plain_interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.label = label
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.live_mode = self.stream.isatty() if live is None else live
        self.plain_interval_s = plain_interval_s
        metrics = job_dir / "metrics"
        self._trainer = MetricsTail(metrics / "trainer.jsonl")
        self._explorer_dir = metrics
        self._explorers: dict[Path, MetricsTail] = {}
        self.trainer_step = 0
        self.explorer_step = 0
        self.reward: float | None = None
        self.tokens_per_s: float | None = None
        self.model_version: float | None = None
        self.loss: tuple[str, float] | None = None
        self._clock = clock
        self._t0 = clock()
        self._explorer_steps: dict[Path, int] = {}
        # (when, trainer step) the ETA's rate is measured from; None: from the next line read
        self._rate_from: tuple[float, int] | None = None
        self._last_plain = 0.0
        self._printed_step = -1
        self._live: Any = None

    # ------------------------------------------------------------------ reading
    def poll(self) -> None:
        records = self._trainer.read_new()
        for rec in records:
            step = int(rec.get("step", 0))
            if step < self.trainer_step:
                self._rate_from = None  # a restarted trainer rewound to its checkpoint
            self.trainer_step = step
            for key in ("actor/pg_loss", "actor/sft_loss", "critic/vf_loss"):
                if rec.get(key) is not None:
                    self.loss = (key, float(rec[key]))
                    break
        if records and self._rate_from is None:
            self._rate_from = (self._clock(), self.trainer_step)
        for path in sorted(self._explorer_dir.glob("explorer*.jsonl")):
            tail = self._explorers.setdefault(path, MetricsTail(path))
            for rec in tail.read_new():
                if "rollout/reward/mean" not in rec:
                    continue  # eval / bench lines
                self._explorer_steps[path] = int(rec.get("step", 0))
                self.reward = rec.get("rollout/reward/mean")
                self.tokens_per_s = rec.get("rollout/tokens_per_s")
                self.model_version = rec.get("rollout/model_version")
        self.explorer_step = max(self._explorer_steps.values(), default=0)

    def restarted(self) -> None:
        """A process was restarted: the steps before it say nothing about the rate from now on."""
        self._rate_from = None

    @property
    def eta_s(self) -> float | None:
        if not self.total_steps or self._rate_from is None:
            return None
        t_from, s_from = self._rate_from
        done = self.trainer_step - s_from
        if done <= 0:
            return None
        rate = (self._clock() - t_from) / done
        return max(0.0, (self.total_steps - self.trainer_step) * rate)

    # ------------------------------------------------------------------ rendering
    def line(self) -> str:
        total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"[{self.label}] step {self.trainer_step}{total}"]
        if self.explorer_step:
            parts.append(f"explore {self.explorer_step}")
            parts.append(f"reward {_fmt(self.reward)}")
            parts.append(f"tokens/s {_fmt(self.tokens_per_s, '.0f')}")
            parts.append(f"model_version {_fmt(self.model_version, '.0f')}")
        if self.loss is not None:
            parts.append(f"{self.loss[0]} {self.loss[1]:.4f}")
        eta = self.eta_s
        parts.append(f"elapsed {self._clock() - self._t0:.0f}s")
        if eta is not None:
            parts.append(f"ETA {eta:.0f}s")
        return "  ".join(parts)

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(title=f"rft run: {self.label}", show_header=True, expand=False)
        for col in ("step", "explore step", "reward", "tokens/s", "model_version", "loss", "elapsed", "ETA"):
            table.add_column(col, justify="right")
        eta = self.eta_s
        total = f"/{self.total_steps}" if self.total_steps else ""
        table.add_row(
            f"{self.trainer_step}{total}",
            str(self.explorer_step or "-"),
            _fmt(self.reward),
            _fmt(self.tokens_per_s, ".0f"),
            _fmt(self.model_version, ".0f"),
            f"{self.loss[1]:.4f}" if self.loss else "-",
            f"{self._clock() - self._t0:.0f}s",
            "-" if eta is None else f"{eta:.0f}s",
        )
        return table

    def start(self) -> None:
        if self.live_mode:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table(), console=Console(file=self.stream), refresh_per_second=4)
            self._live.start()

    def render(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            return
        now = self._clock()
        if self.trainer_step != self._printed_step and now - self._last_plain >= self.plain_interval_s:
            self._printed_step, self._last_plain = self.trainer_step, now
            print(self.line(), file=self.stream, flush=True)

    def stop(self) -> None:
        self.poll()
        if self._live is not None:
            self._live.update(self._table())
            self._live.stop()
            self._live = None
        else:
            print(self.line(), file=self.stream, flush=True)
