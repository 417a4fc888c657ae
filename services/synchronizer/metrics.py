"""Prometheus view of the synchronizer: on each scrape it reads the core's `run_state()` on the
service's event loop (the published version, the trainer's and explorers' steps, each member's held
version and whether it is alive) and the count of the core's events by kind (`reported` with failures,
`lost`, `generation`, ...). Names and the alert rules on them: docs/metrics.md."""

from __future__ import annotations

import asyncio
from collections import Counter

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.common.loop_collector import LoopCollector
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.members import Event
from services.synchronizer.records import RunState


def metric_families(state: RunState | None, events: Counter[str]) -> list:
    published = GaugeMetricFamily("rft_synchronizer_published_version", "Latest published weight version")
    trainer_step = GaugeMetricFamily("rft_synchronizer_trainer_step", "Steps the trainer reported")
    explorer_step = GaugeMetricFamily("rft_synchronizer_explorer_step", "Steps the explorers reported")
    syncing = GaugeMetricFamily("rft_synchronizer_sync_in_progress", "1 while a weight broadcast runs")
    member_labels = ["member", "role"]
    held = GaugeMetricFamily(
        "rft_synchronizer_member_model_version", "Weight version each member holds", labels=member_labels
    )
    alive = GaugeMetricFamily("rft_synchronizer_member_up", "1 while a member is alive", labels=member_labels)
    counted = CounterMetricFamily("rft_synchronizer_events", "Synchronizer events by kind", labels=["kind"])
    for kind, n in sorted(events.items()):
        counted.add_metric([kind], n)
    families = [published, trainer_step, explorer_step, syncing, held, alive, counted]
    if state is None:
        return families
    published.add_metric([], state.published.version)
    trainer_step.add_metric([], state.trainer_step)
    explorer_step.add_metric([], state.explorer_step)
    syncing.add_metric([], float(state.sync_in_progress))
    for m in state.members:
        labels = [m.member_id, m.role.name.lower()]
        held.add_metric(labels, m.model_version)
        alive.add_metric(labels, float(m.alive))
    return families


class SynchronizerCollector(LoopCollector):
    """Register with `REGISTRY.register(...)`; pass `count` to the core's `on_event` chain."""

    def __init__(self, core: SynchronizerCore, loop: asyncio.AbstractEventLoop, timeout_s: float = 5.0):
        super().__init__(loop, timeout_s)
        self.core = core
        self.events: Counter[str] = Counter()

    def count(self, event: Event) -> None:
        self.events[event.kind + ("_failed" if event.detail.startswith("failed") else "")] += 1

    async def read(self) -> RunState:
        return self.core.run_state()

    def families(self, state: RunState | None) -> list:
        return metric_families(state, Counter(self.events))
