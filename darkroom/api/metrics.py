"""Prometheus metrics of the API: request counters and latencies, and queue health.

Queue health (DESIGN §6) is read from the database at scrape time rather than kept in
process memory: any number of API processes share one queue, and each must report the
same truth, not what it happened to see.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from darkroom.card import STATUSES
from darkroom.stats import QueueStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestMetrics:
    """Counters and histograms of one app, in a registry of its own (one per app, so
    several apps in one process, as in tests, never collide on metric names)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "darkroom_http_requests",
            "HTTP requests answered, by route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "darkroom_http_request_duration_seconds",
            "Time to answer an HTTP request, by route template.",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )


def route_template(scope: Scope) -> str:
    # The template ("/v1/files/{file_id}"), never the raw path: ids would make the label
    # set unbounded.
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path is not None else "<unmatched>"


class MetricsMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware), so streamed bodies pass through untouched."""

    def __init__(self, app: ASGIApp, metrics: RequestMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = route_template(scope)
            method = str(scope.get("method", ""))
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)


def queue_families(stats: QueueStats | None) -> list[Metric]:
    """The §6 gauges from one `stats.read()` answer (None: the database did not answer)."""
    up = GaugeMetricFamily(
        "darkroom_queue_stats_up", "1 if the queue statistics could be read at this scrape."
    )
    up.add_metric([], 0.0 if stats is None else 1.0)
    if stats is None:
        return [up]
    files = GaugeMetricFamily("darkroom_queue_files", "Cards per status.", labels=["status"])
    for status in STATUSES:
        files.add_metric([status], float(stats.counts.get(status, 0)))
    age = stats.oldest_claimable_age_seconds
    oldest = GaugeMetricFamily(
        "darkroom_queue_oldest_claimable_age_seconds",
        "Age of the oldest claimable job (0 when there is none).",
        value=float(age) if age is not None else 0.0,
    )
    expired = GaugeMetricFamily(
        "darkroom_queue_expired_leases",
        "Processing cards whose lease has expired.",
        value=float(stats.expired_leases),
    )
    share = GaugeMetricFamily(
        "darkroom_queue_rejected_share",
        "Share of finished cards that were rejected, per window (NaN with none finished).",
        labels=["window"],
    )
    for window, value in (("1h", stats.rejected_share_1h), ("24h", stats.rejected_share_24h)):
        share.add_metric([window], math.nan if value is None else float(value))
    completed = GaugeMetricFamily(
        "darkroom_queue_completed_last_minute",
        "Cards that became ready in the last minute.",
        value=float(stats.completed_last_minute),
    )
    # A gauge, not a counter: the event log behind it is pruned, so it can go down.
    lost = GaugeMetricFamily(
        "darkroom_queue_lease_lost_events",
        "lease_lost events in the (retained) event log.",
        value=float(stats.lease_lost_total),
    )
    paused = GaugeMetricFamily(
        "darkroom_queue_paused_workers",
        "Workers not claiming because the object store is failing.",
        value=float(len(stats.paused_workers)),
    )
    # An operator's pauses (few, each made by hand): "*" is every owner or priority.
    claim_pauses = GaugeMetricFamily(
        "darkroom_queue_claims_paused",
        "1 per operator's pause of claiming in force (darkroom pause), by its scope.",
        labels=["owner", "priority"])
    for p in stats.claim_pauses:
        claim_pauses.add_metric([p.owner or "*", p.priority or "*"], 1.0)
    rejected = GaugeMetricFamily("darkroom_queue_rejected_by_code",
                                 "Rejected cards per error code.", labels=["code"])
    for code, n in stats.rejected_by_code.items():
        rejected.add_metric([code], float(n))
    return [up, files, oldest, expired, share, completed, lost, paused, claim_pauses,
            rejected, *backlog_families(stats)]


def backlog_families(stats: QueueStats) -> list[Metric]:
    """Who is waiting. Owners are labels only for the top few (the backlog's top_owners),
    so the label set stays bounded however many owners the archive has."""
    backlog = stats.backlog
    waiting = GaugeMetricFamily("darkroom_queue_waiting", "Queued cards per priority.",
                                labels=["priority"])
    oldest = GaugeMetricFamily(
        "darkroom_queue_oldest_wait_seconds",
        "Wait of the oldest due card per priority (0 when there is none).",
        labels=["priority"])
    for priority, b in backlog.by_priority.items():
        waiting.add_metric([priority], float(b.waiting))
        oldest.add_metric([priority], float(b.oldest_wait_seconds or 0.0))
    owners = GaugeMetricFamily("darkroom_queue_owners_waiting",
                               "Owners with at least one queued card.",
                               value=float(backlog.owners_waiting))
    top = GaugeMetricFamily(
        "darkroom_queue_top_owner_waiting",
        "Queued cards of the owners with the most waiting (top 10 only).",
        labels=["owner"])
    top_oldest = GaugeMetricFamily(
        "darkroom_queue_top_owner_oldest_wait_seconds",
        "Wait of the oldest due card of each of the top owners.", labels=["owner"])
    for o in backlog.top_owners:
        top.add_metric([o.owner], float(o.waiting))
        top_oldest.add_metric([o.owner], float(o.oldest_wait_seconds or 0.0))
    rederive = GaugeMetricFamily(
        "darkroom_queue_rederive_pending",
        "Re-derives queued or running (the card still serves its previous derivative).",
        value=float(stats.rederive_pending))
    return [waiting, oldest, owners, top, top_oldest, rederive]


class _Exposition:
    """What generate_latest needs: something with collect()."""

    def __init__(self, registry: CollectorRegistry, extra: Iterable[Metric]) -> None:
        self.registry = registry
        self.extra = list(extra)

    def collect(self) -> Iterator[Metric]:
        yield from self.extra
        yield from self.registry.collect()


def render(metrics: RequestMetrics, stats: QueueStats | None) -> bytes:
    exposition = _Exposition(metrics.registry, queue_families(stats))
    return generate_latest(exposition)
