"""/metrics in Prometheus' text format: what the API saw (requests by route) and what the database
says about the service (jobs by status, the queue, live workers, running jobs' speed).

Request figures are counted in this process. Everything else is read from the database at scrape
time: the workers write their figures into rows the API already reads (each job's metrics and
checkpoint events, the workers' heartbeat rows), so the API needs neither torch nor a worker link.
Each app has its own registry, so several apps in one process (tests) do not collide.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relay.events import METRICS, CheckpointEvent
from relay.sft import status as job_status
from relay.training import status as session_status
from relay_api.db import utcnow
from relay_api.models import fine_tune_events, fine_tunes, training_sessions, worker_heartbeats
from relay_api.settings import Settings

# The *_created series (when each series began) only add noise to a scrape.
disable_created_metrics()

# Request latencies: from a cached read (milliseconds) to a long download or event stream.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A worker that has not written its heartbeat for this many reconciler periods counts as gone.
WORKER_MISSED_BEATS = 3
# The figures a job's metrics events carry, as (event field, metric name, help).
JOB_FIGURES = (
    ("steps_per_second", "relay_fine_tune_steps_per_second", "Training steps per second of a running job."),
    (
        "samples_per_second",
        "relay_fine_tune_samples_per_second",
        "Training samples per second of a running job.",
    ),
    (
        "data_wait",
        "relay_fine_tune_data_wait_ratio",
        "Share of a running job's step time spent waiting for the next batch (0 to 1).",
    ),
    (
        "gpu_memory_bytes",
        "relay_fine_tune_gpu_memory_bytes",
        "GPU memory a running job holds (CUDA only).",
    ),
)
UNROUTED = "unrouted"


class Metrics:
    """The app's registry and its request instruments."""

    def __init__(self, readers: sessionmaker[Session], settings: Settings) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "relay_http_requests",
            "HTTP requests answered, by method, route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "relay_http_request_duration_seconds",
            "Time from a request's arrival to its response's end, by method and route template "
            "(an event stream counts until it ends).",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(ServiceCollector(readers, settings))


class RequestMetrics:
    """ASGI middleware: counts and times each HTTP request under its route template, so
    /v1/fine-tunes/ft-1 and /v1/fine-tunes/ft-2 are one series."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        # Routing may rewrite the path (a mount strips its prefix): keep the one that came in.
        arrived = {**scope}

        async def note_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, note_status)
        finally:
            route = route_template(scope, arrived)
            method = scope.get("method", "GET")
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)


def route_template(scope: Scope, arrived: Scope) -> str:
    """The path template of the route that served `scope`: a mount's prefix for the console's
    files, and `unrouted` for a request answered before routing (an unknown path, or one the
    guard refused: no key, a body too large). `arrived` is the scope before routing changed it."""
    route = scope.get("route")
    if route is not None:
        return str(getattr(route, "path", "")) or UNROUTED
    app = scope.get("app")
    for candidate in getattr(getattr(app, "router", None), "routes", []):
        path = getattr(candidate, "path", None)
        if path and candidate.matches(arrived)[0] == Match.FULL:
            return str(path)
    return UNROUTED


class ServiceCollector(Collector):
    """Reads the service's state from the database on each scrape."""

    def __init__(self, readers: sessionmaker[Session], settings: Settings) -> None:
        self.readers = readers
        self.settings = settings

    def collect(self) -> Iterator[Metric]:
        now = utcnow()
        with self.readers() as db:
            yield from self._jobs(db, now)
            yield from self._sessions(db)
            yield from self._workers(db, now)
            yield from self._running_jobs(db)

    def _jobs(self, db: Session, now: dt.datetime) -> Iterator[Metric]:
        counts = _counts(db, fine_tunes.c.status)
        jobs = GaugeMetricFamily("relay_fine_tunes", "Fine-tune jobs by status.", labels=["status"])
        for status in job_status.STATUSES:
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs

        oldest = db.execute(
            select(func.min(fine_tunes.c.created_at)).where(fine_tunes.c.status == job_status.QUEUED)
        ).scalar()
        yield GaugeMetricFamily(
            "relay_queue_depth",
            "Fine-tune jobs waiting for a worker.",
            value=counts.get(job_status.QUEUED, 0),
        )
        yield GaugeMetricFamily(
            "relay_queue_oldest_age_seconds",
            "How long the oldest queued fine-tune has waited (0 when none waits).",
            value=0.0 if oldest is None else max(0.0, (now - oldest).total_seconds()),
        )

    def _sessions(self, db: Session) -> Iterator[Metric]:
        counts = _counts(db, training_sessions.c.status)
        family = GaugeMetricFamily(
            "relay_training_sessions", "Training sessions by status.", labels=["status"]
        )
        for status in session_status.STATUSES:
            family.add_metric([status], counts.get(status, 0))
        yield family

    def _workers(self, db: Session, now: dt.datetime) -> Iterator[Metric]:
        horizon = now - dt.timedelta(seconds=WORKER_MISSED_BEATS * self.settings.reconcile_seconds)
        alive = db.execute(
            select(func.count()).select_from(worker_heartbeats).where(worker_heartbeats.c.seen_at >= horizon)
        ).scalar()
        yield GaugeMetricFamily(
            "relay_workers_alive",
            f"Workers whose heartbeat is at most {WORKER_MISSED_BEATS} reconciler periods old.",
            value=alive or 0,
        )

    def _running_jobs(self, db: Session) -> Iterator[Metric]:
        running = (
            db.execute(
                select(fine_tunes.c.id).where(
                    fine_tunes.c.status.in_((job_status.RUNNING, job_status.CANCEL_REQUESTED))
                )
            )
            .scalars()
            .all()
        )
        figures = {field: GaugeMetricFamily(name, text, labels=["job"]) for field, name, text in JOB_FIGURES}
        checkpoints = GaugeMetricFamily(
            "relay_fine_tune_checkpoint_seconds",
            "How long a running job's last checkpoint took to write.",
            labels=["job"],
        )
        for job_id in running:
            metrics = _latest_event(db, job_id, METRICS)
            for field, family in figures.items():
                value = metrics.get(field) if metrics else None
                if isinstance(value, int | float):
                    family.add_metric([job_id], float(value))
            checkpoint = _latest_event(db, job_id, CheckpointEvent.kind)
            if checkpoint and isinstance(checkpoint.get("seconds"), int | float):
                checkpoints.add_metric([job_id], float(checkpoint["seconds"]))
        yield from figures.values()
        yield checkpoints


def _latest_event(db: Session, job_id: str, kind: str) -> dict[str, Any] | None:
    data = db.execute(
        select(fine_tune_events.c.data)
        .where(fine_tune_events.c.job_id == job_id, fine_tune_events.c.kind == kind)
        .order_by(fine_tune_events.c.id.desc())
        .limit(1)
    ).scalar()
    return data if isinstance(data, dict) else None


def _counts(db: Session, status: Any) -> dict[str, int]:
    """Rows per value of the `status` column."""
    rows = db.execute(select(status, func.count()).group_by(status)).all()
    return {str(value): int(count) for value, count in rows}
