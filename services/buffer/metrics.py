"""Prometheus view of the buffer: on each scrape it asks the core for the same `Stats` the RPC returns,
so `/metrics` and `Stats` never disagree (and counters kept in Redis survive a service restart).

The scrape runs in prometheus_client's HTTP thread; the collector (a `LoopCollector`) hands the query to
the service's event loop and waits for it with a deadline.
"""

from __future__ import annotations

import asyncio

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.buffer.core import BufferCore
from services.buffer.records import StoreStats
from services.common.loop_collector import LoopCollector


def metric_families(stats_by_group: dict[str, StoreStats]) -> list:
    """Metric families for the given per-consumer-group stats (store-wide numbers from any group)."""
    size = GaugeMetricFamily("rft_buffer_size", "Stored experiences not yet acked", labels=["store"])
    capacity = GaugeMetricFamily("rft_buffer_capacity", "Capacity in experiences", labels=["store"])
    accepted = CounterMetricFamily("rft_buffer_accepted", "Experiences accepted", labels=["store"])
    rejected = CounterMetricFamily(
        "rft_buffer_rejected", "Experiences refused by validation", labels=["store"]
    )
    versions = GaugeMetricFamily(
        "rft_buffer_experiences", "Stored experiences per model_version", labels=["store", "model_version"]
    )
    group_labels = ["store", "consumer_group"]
    leases = GaugeMetricFamily("rft_buffer_pending_leases", "Leases not yet acked", labels=group_labels)
    pending = GaugeMetricFamily("rft_buffer_pending_experiences", "Leased, not acked", labels=group_labels)
    oldest = GaugeMetricFamily(
        "rft_buffer_oldest_lease_age_seconds", "Age of the oldest lease held (0: none)", labels=group_labels
    )
    dropped = CounterMetricFamily("rft_buffer_dropped_stale", "Dropped by staleness", labels=group_labels)
    redelivered = CounterMetricFamily(
        "rft_buffer_redelivered", "Experiences redelivered", labels=group_labels
    )
    acked = CounterMetricFamily("rft_buffer_acked", "Experiences acked", labels=group_labels)
    families = [
        size,
        capacity,
        accepted,
        rejected,
        versions,
        leases,
        pending,
        oldest,
        dropped,
        redelivered,
        acked,
    ]
    if not stats_by_group:
        return families
    any_stats = next(iter(stats_by_group.values()))
    store = any_stats.store
    size.add_metric([store], any_stats.size)
    capacity.add_metric([store], any_stats.capacity)
    accepted.add_metric([store], any_stats.accepted)
    rejected.add_metric([store], any_stats.rejected)
    for version, count in sorted(any_stats.per_model_version.items()):
        versions.add_metric([store, str(version)], count)
    for group, stats in sorted(stats_by_group.items()):
        labels = [store, group]
        leases.add_metric(labels, stats.pending_leases)
        pending.add_metric(labels, stats.pending_experiences)
        oldest.add_metric(labels, stats.oldest_lease_age_s)
        dropped.add_metric(labels, stats.dropped_stale)
        redelivered.add_metric(labels, stats.redelivered)
        acked.add_metric(labels, stats.acked)
    return families


class BufferCollector(LoopCollector):
    """Register with `prometheus_client.REGISTRY.register(BufferCollector(core, loop))`."""

    def __init__(self, core: BufferCore, loop: asyncio.AbstractEventLoop, timeout_s: float = 5.0):
        super().__init__(loop, timeout_s)
        self.core = core

    async def read(self) -> dict[str, StoreStats]:
        return {group: await self.core.stats(group) for group in sorted(self.core.consumer_groups)}

    def families(self, state: dict[str, StoreStats] | None) -> list:
        return metric_families(state or {})
