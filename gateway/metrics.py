"""Prometheus metrics of one gateway, in a dedicated registry (served at GET /metrics).

A dedicated `CollectorRegistry` per server keeps several servers in one process (tests) apart.
Gauges that are sums over sessions are computed at scrape time, not updated per frame.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.quotas import TenantUsage
from gateway.overload import Overload

log = logging.getLogger("reactgate.gateway")

# Delivery latency: event made (Event.ts) → handed to the client's socket.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.connections = Gauge("reactgate_connections", "Open WebSocket connections", registry=r)
        self.connections_total = Counter(
            "reactgate_connections_opened", "WebSocket connections accepted", registry=r
        )
        self.connections_refused = Counter(
            "reactgate_connections_refused", "Connections refused, by reason", ["reason"], registry=r
        )
        # docs/design.md#overload: the two signals, smoothed; over their limits new clients are
        # refused (reactgate_connections_refused{reason="overloaded"}).
        self.loop_lag = Gauge(
            "reactgate_event_loop_lag_seconds", "How late the gateway's event loop runs its timers (smoothed)",
            registry=r,
        )
        self.late_deliveries = Gauge(
            "reactgate_late_delivery_share",
            "Share of live events reaching a connection's queue later than REACTGATE_OVERLOAD_DELIVERY_MS (smoothed)",
            registry=r,
        )
        self.frames_in = Counter("reactgate_frames_in", "Client frames received, by type", ["type"], registry=r)
        self.errors = Counter("reactgate_errors", "Error frames sent, by code", ["code"], registry=r)
        self.events_sent = Counter("reactgate_events_sent", "Event frames sent to clients", registry=r)
        self.send_queue_depth = Gauge(
            "reactgate_send_queue_depth", "Frames waiting in all connections' send queues", registry=r
        )
        self.slow_consumers = Counter(
            "reactgate_slow_consumer", "Send-queue overflows (subscriptions paused)", registry=r
        )
        self.delivery_latency = Histogram(
            "reactgate_delivery_latency_seconds",
            "Event ts to the frame being handed to the client socket",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Quotas (docs/design.md#quotas): the store's tenant counters in their current window, read
        # every `quota_metrics_interval_s` (the same on every replica: they are shared), and the
        # refusals this replica sent.
        self.quota_used = Gauge(
            "reactgate_quota_used", "Tenant quota counters in their current window (from the store)",
            ["tenant", "quota"], registry=r,
        )
        self.quota_refused = Counter(
            "reactgate_quota_refused", "quota_exceeded refusals sent by this replica",
            ["tenant", "quota", "scope"], registry=r,
        )

        # The configuration generation this replica serves (docs/design.md#generations), "local" on
        # the local backend: reactgate_config_info{generation="…"} 1.
        self.config = Info("reactgate_config", "The configuration generation this replica serves", registry=r)

        # The store as this replica sees it (docs/design.md#store-outage): up or not, for how long it
        # was not, and the store's own counters (gateway/server.py asks the backend for them).
        self.store = StoreMetrics()
        r.register(self.store)

    def track(self, connections: Callable[[], int], queue_depth: Callable[[], int]) -> None:
        """Compute the per-session sums at scrape time."""
        self.connections.set_function(lambda: float(connections()))
        self.send_queue_depth.set_function(lambda: float(queue_depth()))

    def track_overload(self, overload: Overload) -> None:
        self.loop_lag.set_function(lambda: overload.lag.value)
        self.late_deliveries.set_function(lambda: overload.late.value)

    def set_quota_usage(self, usage: Iterable[TenantUsage]) -> None:
        """Replace the tenant counters: a window that ended takes its series with it."""
        self.quota_used.clear()
        for tenant, quota, used in usage:
            self.quota_used.labels(tenant, quota).set(used)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# A store counter's name, as `store_counters()` gives it: it becomes reactgate_store_<name>_total;
# the names of the gateway's own store metrics are taken.
_COUNTER_NAME: Final = re.compile(r"^[a-z][a-z0-9_]*$")
_TAKEN: Final = frozenset({"up", "outage_seconds"})


class StoreMetrics(Collector):
    """The store's health and counters, at scrape time, from what the gateway last saw
    (`GatewayServer.refresh_store`: every `STORE_POLL_S`, and on each /readyz and /metrics).

    reactgate_store_up                   1 while the store takes calls, 0 during an outage
    reactgate_store_outage_seconds_total seconds this replica saw the store down: each interval
                                         between two looks that began with the store down counts
                                         whole (so the resolution is the poll interval)
    reactgate_store_<name>_total         each counter of the backend's `store_counters()` (e.g.
                                         retried_batches), as the store counts it

    None of them exists before the first look: a backend without `store_health` (or
    `store_counters`) has none, rather than a made-up 1 or 0.
    """

    def __init__(self) -> None:
        self.up: bool | None = None         # None: never seen
        self.outage_s = 0.0
        self.counters: dict[str, float] = {}
        self._seen_at: float | None = None  # time.monotonic() of the last look

    def observe(self, ok: bool, now: float) -> None:
        """One look at the store's health at `now` (time.monotonic())."""
        if self.up is False and self._seen_at is not None:
            self.outage_s += max(0.0, now - self._seen_at)
        self.up = ok
        self._seen_at = now

    def set_counters(self, counters: Mapping[str, float]) -> None:
        """Replace the store's counters (totals since the store started). A name that is not a
        metric name's tail (`[a-z][a-z0-9_]*`, an optional `_total` dropped; not `up` or
        `outage_seconds`), or a value that is not a finite number, is skipped."""
        kept: dict[str, float] = {}
        for name, value in counters.items():
            stem = name.removesuffix("_total") if isinstance(name, str) else ""
            if not _COUNTER_NAME.match(stem) or stem in _TAKEN:
                log.warning("store counter %.80r skipped: not a metric name", name)
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                log.warning("store counter %s skipped: %.80r is not a number", stem, value)
                continue
            kept[stem] = float(value)
        self.counters = kept

    def collect(self) -> Iterator[Metric]:
        if self.up is not None:
            yield GaugeMetricFamily("reactgate_store_up", "1 while the store takes calls, 0 during an outage",
                                    value=1.0 if self.up else 0.0)
            yield CounterMetricFamily("reactgate_store_outage_seconds",
                                      "Seconds this replica saw the store unavailable", value=self.outage_s)
        for name, value in sorted(self.counters.items()):
            yield CounterMetricFamily(f"reactgate_store_{name}", f"The store's {name.replace('_', ' ')} "
                                      "(store_counters())", value=value)
