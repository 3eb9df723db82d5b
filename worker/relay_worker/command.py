"""The command line of a Relay worker: `celery -A relay_worker.app worker` with the options every
Relay worker runs with. `python -m relay_worker` runs it (docker-compose, `relay server`); the
tests and the benchmarks start it directly.

Gossip and mingle (Celery's worker-to-worker messages, at start and while running) stay off:
Relay's workers coordinate through the database (leases, seats, heartbeats), not through Celery.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

CELERY_APP = "relay_worker.app"


def worker_command(
    *,
    concurrency: int = 1,
    queues: Sequence[str] = (),
    loglevel: str = "INFO",
    heartbeat: bool = True,
) -> list[str]:
    """The worker's command line: `concurrency` processes (one job or session at a time each: one
    per GPU), consuming `queues` (none named: every queue the app declares, recipe jobs' and
    training sessions'); `heartbeat=False` turns off Celery's own event heartbeats (Relay's
    workers beat in the database either way)."""
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        CELERY_APP,
        "worker",
        "--loglevel",
        loglevel,
        "--concurrency",
        str(concurrency),
    ]
    if queues:
        command += ["--queues", ",".join(queues)]
    command += ["--without-gossip", "--without-mingle"]
    if not heartbeat:
        command.append("--without-heartbeat")
    return command
