"""The scale part of bench_api.py: the same routes on a database of 100 jobs and on one of 100,000
jobs across 1,000 users with 10 million events, and the time a queued job waits to be claimed with
1 to 8 workers reading one queue.

The large database is written by PostgreSQL itself (INSERT ... SELECT over generate_series), in the
shape the service writes: each user has 100 jobs a second apart, every job 100 metrics events. The
benchmark's own user has the same 100 jobs and one job of 100 events in both databases, so a route
answers the same rows in both, and only what else the tables hold differs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

USERS = 1_000
JOBS_PER_USER = 100
EVENTS_PER_JOB = 100
CONFIG = '{"model": "pi05-tiny", "dataset_name": "bench/dataset", "steps": 1000, "batch_size": 2}'
METRICS = '{"step": 0, "loss": 0.5, "grad_norm": 1.0, "lr": 2e-05, "skipped": 0.0}'


def seed_others(database_url: str, users: int = USERS) -> dict[str, float]:
    """Add `users` users, each with JOBS_PER_USER completed jobs of EVENTS_PER_JOB events; the
    counts and the seconds it took. The benchmark's user and job are already there."""
    started = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO users (name, created_at) SELECT 'user-' || n, now() FROM generate_series(1, %s) n",
            (users,),
        )
        db.execute(
            """
            INSERT INTO fine_tunes (id, user_id, config, status, step, loss, attempt, handovers,
                                    created_at, updated_at, started_at, finished_at)
            SELECT 'ft-' || lpad(to_hex(u.id * 1000 + j), 12, '0'), u.id, %s::json, 'completed',
                   1000, 0.5, 1, 0, ts, ts, ts, ts
            FROM users u, generate_series(1, %s) j,
                 LATERAL (SELECT now() - interval '1 day' + j * interval '1 second') t(ts)
            WHERE u.name LIKE 'user-%%'
            """,
            (CONFIG, JOBS_PER_USER),
        )
        db.execute(
            """
            INSERT INTO fine_tune_events (job_id, step, kind, attempt, data, created_at)
            SELECT f.id, s * 10, 'metrics', 1, %s::json, f.created_at
            FROM fine_tunes f, generate_series(1, %s) s
            WHERE f.user_id IN (SELECT id FROM users WHERE name LIKE 'user-%%')
            """,
            (METRICS, EVENTS_PER_JOB),
        )
        db.execute("VACUUM ANALYZE")
        jobs = db.execute("SELECT count(*) FROM fine_tunes").fetchone()
        events = db.execute("SELECT count(*) FROM fine_tune_events").fetchone()
        size = db.execute("SELECT pg_database_size(current_database())").fetchone()
    assert jobs is not None and events is not None and size is not None
    return {
        "jobs": jobs[0],
        "events": events[0],
        "bytes": size[0],
        "seconds": time.perf_counter() - started,
    }


def seed_user_jobs(database_url: str, user_id: int, count: int) -> None:
    """`count` more completed jobs of the benchmark's user (no events), a second apart."""
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(
            """
            INSERT INTO fine_tunes (id, user_id, config, status, step, loss, attempt, handovers,
                                    created_at, updated_at, started_at, finished_at)
            SELECT 'ft-b' || lpad(to_hex(j), 11, '0'), %s, %s::json, 'completed', 1000, 0.5, 1, 0,
                   ts, ts, ts, ts
            FROM generate_series(1, %s) j,
                 LATERAL (SELECT now() - interval '2 days' + j * interval '1 second') t(ts)
            """,
            (user_id, CONFIG, count),
        )


def claim_waits(
    start_workers: Callable[[int], list[Any]],
    stop_workers: Callable[[list[Any]], None],
    submit_and_wait: Callable[[], float],
    counts: tuple[int, ...],
    jobs: int,
) -> dict[int, float]:
    """Median seconds from created_at to started_at of `jobs` jobs, one at a time, with each count
    of workers reading the queue."""
    medians: dict[int, float] = {}
    for count in counts:
        workers = start_workers(count)
        try:
            # One job first, untimed: the API's connections are warm. It reaches one worker only;
            # the others' first jobs are timed, as a fresh worker's first claim is part of the path.
            submit_and_wait()
            medians[count] = statistics.median(submit_and_wait() for _ in range(jobs))
        finally:
            stop_workers(workers)
    return medians
