"""Prometheus view of the step metrics a trainer or an explorer logs.

`StepExport` is one more `Monitor` (`build_monitor` adds it to every trainer and explorer): it keeps the
latest step's figures, and one collector on the default registry serves every live export under
conventional names (`rft_<role>_<name>`, units in the name, `_total` for counters), labelled by the
monitor run. The names, and the recording and alert rules built on them, are listed in
docs/metrics.md (deploy/prometheus/ holds the rules).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector


@dataclass(frozen=True)
class Series:
    """One exported series: `key` is the step-metric key it reads (a counter adds it every step; the
    key "" counts steps), `name` its name after `rft_<role>_`."""

    name: str
    key: str
    help: str
    counter: bool = False


TRAINER = (
    Series("steps", "", "Training steps finished", counter=True),
    Series("tokens", "perf/total_num_tokens", "Tokens trained", counter=True),
    Series("dropped_stale_experiences", "sample/dropped_stale", "Experiences dropped as stale", counter=True),
    Series("step_seconds", "timing_s/step", "Wall time of the last step"),
    Series("tokens_per_second", "perf/throughput", "Tokens per second of the last step"),
    Series("sample_staleness_max", "sample/staleness/max", "Largest staleness (versions) in the last batch"),
    Series("reward_mean", "critic/rewards/mean", "Mean reward of the last batch"),
    Series("policy_loss", "actor/pg_loss", "Policy loss of the last step"),
    Series("grad_norm", "actor/grad_norm", "Gradient norm of the last step"),
    Series("checkpoint_save_seconds", "timing_s/save_checkpoint", "Time the last checkpoint save took"),
    Series("unacked_steps", "trainer/unacked_steps", "Steps trained whose checkpoint is not yet durable"),
)
EXPLORER = (
    Series("steps", "", "Explore steps finished", counter=True),
    Series("experiences", "rollout/experience_count", "Experiences produced", counter=True),
    Series("generated_tokens", "rollout/generated_tokens", "Tokens generated", counter=True),
    Series("failed_tasks", "rollout/failed_task_count", "Tasks that failed", counter=True),
    Series("model_version", "rollout/model_version", "Weight version of the last step's rollouts"),
    Series("step_seconds", "time/explore_step", "Wall time of the last explore step"),
    Series("tokens_per_second", "rollout/tokens_per_s", "Generated tokens per second in the last step"),
    Series("reward_mean", "rollout/reward/mean", "Mean reward of the last step"),
    Series("load_weights_seconds", "time/load_weights", "Time the last weight load took"),
    Series("wait_for_weights_seconds", "time/wait_for_weights", "Time the last step waited for weights"),
)
SERIES = {"trainer": TRAINER, "explorer": EXPLORER}


class StepExport:
    """The latest figures of one monitor run; `constants` are fixed gauges (a bound, an interval)."""

    def __init__(self, role: str, run: str, constants: Mapping[str, float] | None = None):
        if role not in SERIES:
            raise ValueError(f"no Prometheus series for role {role!r}; one of {sorted(SERIES)}")
        self.role, self.run = role, run
        self.constants = dict(constants or {})
        self.step = 0
        self.last_step_time = time.time()  # before the first step: since the process began to wait
        self.values: dict[str, float] = {}
        self.totals: dict[str, float] = {s.name: 0.0 for s in SERIES[role] if s.counter}
        self._lock = threading.Lock()  # logged on the service's thread, read on the scrape thread
        _COLLECTOR.add(self)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        with self._lock:
            self.step, self.last_step_time = step, time.time()
            for s in SERIES[self.role]:
                value = 1.0 if not s.key else metrics.get(s.key)
                if value is None or value != value:  # absent or NaN: the series keeps its last value
                    continue
                if s.counter:
                    self.totals[s.name] += float(value)
                else:
                    self.values[s.name] = float(value)

    def close(self) -> None:
        _COLLECTOR.discard(self)

    def families(self) -> list:
        prefix, labels = f"rft_{self.role}_", [self.run]
        with self._lock:
            out = []
            for s in SERIES[self.role]:
                if s.counter:
                    family = CounterMetricFamily(prefix + s.name, s.help, labels=["run"])
                    family.add_metric(labels, self.totals[s.name])
                elif s.name in self.values:
                    family = GaugeMetricFamily(prefix + s.name, s.help, labels=["run"])
                    family.add_metric(labels, self.values[s.name])
                else:
                    continue
                out.append(family)
            fixed = {"step": float(self.step), "last_step_timestamp_seconds": self.last_step_time}
            for name, value in (fixed | self.constants).items():
                family = GaugeMetricFamily(prefix + name, name.replace("_", " "), labels=["run"])
                family.add_metric(labels, value)
                out.append(family)
        return out


class _StepCollector(Collector):
    """Every live `StepExport` of this process, merged by metric name (one family per name)."""

    def __init__(self) -> None:
        self._exports: weakref.WeakSet[StepExport] = weakref.WeakSet()
        self._registered = False
        self._lock = threading.Lock()

    def add(self, export: StepExport) -> None:
        with self._lock:
            self._exports.add(export)
            if not self._registered:
                REGISTRY.register(self)
                self._registered = True

    def discard(self, export: StepExport) -> None:
        with self._lock:
            self._exports.discard(export)

    def collect(self) -> Iterator:
        with self._lock:
            exports = list(self._exports)
        merged: dict[str, object] = {}
        for export in exports:
            for family in export.families():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)  # type: ignore[attr-defined]
                else:
                    merged[family.name] = family
        return iter(merged.values())

    def describe(self) -> Iterator:
        return iter(())  # names vary with the live exports; nothing to check at registration


_COLLECTOR = _StepCollector()
