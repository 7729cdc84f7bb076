"""Prometheus metrics of one node (its own registry, so several nodes can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "NodeMetrics"]


class NodeMetrics:
    """Counters the epoch loop, the API and sync update; rendered at ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.epochs = Counter("merklog_epochs", "Epochs evaluated", registry=r)
        self.epoch_seconds = Histogram(
            "merklog_epoch_seconds",
            "Wall time of one epoch",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.facts = Gauge("merklog_facts", "Visible facts in the replica", registry=r)
        self.derived = Gauge("merklog_derived_facts", "Facts derived by the program", registry=r)
        self.deltas = Counter(
            "merklog_deltas", "Signed deltas accepted (local and replicated)", registry=r
        )
        self.writes = Counter("merklog_writes", "Facts asserted or retracted locally", registry=r)
        self.sync_bytes = Counter(
            "merklog_sync_bytes", "Bytes of CAR data moved by sync", ["direction"], registry=r
        )
        self.rejected = Counter(
            "merklog_rejected_inputs", "Inputs rejected (bad syntax, values, blocks)", registry=r
        )
        self.async_messages = Counter(
            "merklog_async_messages",
            "@async messages: queued (out), delivered, failed attempts, received (in)",
            ["event"],
            registry=r,
        )
        self.subscribers = Gauge("merklog_subscribers", "Live-query subscribers", registry=r)
        self.sync_failures = Counter(
            "merklog_sync_failures",
            "Sync attempts that failed (peer unreachable or refusing), by peer URL",
            ["peer"],
            registry=r,
        )
        self.queries_stopped = Counter(
            "merklog_queries_stopped",
            "Queries stopped before their answer, by reason: client gone (the HTTP caller"
            " went away), too large (over node.eval_memory_mb), node closing",
            ["reason"],
            registry=r,
        )
        self.http_requests = Counter(
            "merklog_http_requests",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
