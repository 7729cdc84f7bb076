"""Prometheus metrics of one node (its own registry, so several nodes can share a process)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from merklog.replication.metrics import Metrics as SyncServerCounts

__all__ = ["CONTENT_TYPE_LATEST", "NodeMetrics", "ServedSyncCounts"]


class NodeMetrics:
    """Counters the epoch loop, the API and sync update; rendered at ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.epochs = Counter(
            "merklog_epochs",
            "Epoch evaluations run, idle ones included (the node's epoch number counts only"
            " those that changed something)",
            registry=r,
        )
        self.epoch_seconds = Histogram(
            "merklog_epoch_seconds",
            "Wall time of one epoch",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.facts = Gauge("merklog_facts", "Visible facts in the replica", registry=r)
        self.derived = Gauge("merklog_derived_facts", "Facts derived by the program", registry=r)
        self.deltas = Counter(
            "merklog_deltas",
            "Signed deltas accepted: written here (grants and revokes included), pulled,"
            " pushed to this node, imported",
            registry=r,
        )
        self.writes = Counter("merklog_writes", "Facts asserted or retracted locally", registry=r)
        self.sync_bytes = Counter(
            "merklog_sync_bytes",
            "Bytes of CAR data moved by sync, in syncs this node started and in those it"
            " answered (pushes and block requests included)",
            ["direction"],
            registry=r,
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


class ServedSyncCounts(SyncServerCounts):
    """The sync server's own counters (:class:`merklog.replication.metrics.Metrics`), whose
    bytes in and out also count in ``merklog_sync_bytes_total``: a node that only answers
    syncs (a hub) showed almost none of what it served."""

    #: Server counter → ``direction`` label of ``merklog_sync_bytes_total``.
    DIRECTIONS = {"bytes_in": "in", "bytes_out": "out"}

    def __init__(self, metrics: NodeMetrics) -> None:
        super().__init__()
        self._node_metrics = metrics

    def __setitem__(self, key: str, value: Any) -> None:
        grown = value - self.get(key, 0)
        super().__setitem__(key, value)
        direction = self.DIRECTIONS.get(key)
        if direction is not None and grown > 0:
            self._node_metrics.sync_bytes.labels(direction).inc(grown)
