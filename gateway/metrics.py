"""Prometheus metrics of one gateway, in a dedicated registry (served at GET /metrics).

A dedicated `CollectorRegistry` per server keeps several servers in one process (tests) apart.
Gauges that are sums over sessions are computed at scrape time, not updated per frame.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from actors.quotas import TenantUsage

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

    def track(self, connections: Callable[[], int], queue_depth: Callable[[], int]) -> None:
        """Compute the per-session sums at scrape time."""
        self.connections.set_function(lambda: float(connections()))
        self.send_queue_depth.set_function(lambda: float(queue_depth()))

    def set_quota_usage(self, usage: Iterable[TenantUsage]) -> None:
        """Replace the tenant counters: a window that ended takes its series with it."""
        self.quota_used.clear()
        for tenant, quota, used in usage:
            self.quota_used.labels(tenant, quota).set(used)

    def render(self) -> bytes:
        return generate_latest(self.registry)
