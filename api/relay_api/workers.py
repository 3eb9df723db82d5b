"""The workers alive now, by their heartbeat rows: what the API places jobs and deployments on and
the workers' reconciler and gangs count slots with (a module of its own, so that the workers import
no route's module)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, bindparam, select

from relay_api.db import Db, utcnow
from relay_api.metrics import WORKER_MISSED_BEATS
from relay_api.models import worker_heartbeats


@dataclass(frozen=True)
class LiveWorker:
    gpus: int  # GPUs (or CPU slots) it gives one job
    gpu_memory: int | None  # bytes of each of those GPUs; None: CPU slots
    video_decoders: frozenset[str] | None = None  # video codecs it decodes; None: it did not say


_ALIVE = select(
    worker_heartbeats.c.gpus, worker_heartbeats.c.gpu_memory, worker_heartbeats.c.video_decoders
).where(worker_heartbeats.c.seen_at >= bindparam("horizon"))
_LIVE_WORKERS = _ALIVE.where(worker_heartbeats.c.takes_jobs)
_SERVING_WORKERS = _ALIVE.where(worker_heartbeats.c.serves_deployments)


def live_workers(db: Db, reconcile_seconds: float) -> list[LiveWorker]:
    """The workers alive now that take recipe jobs (and sessions), per their heartbeats."""
    return _alive(db, _LIVE_WORKERS, reconcile_seconds)


def serving_workers(db: Db, reconcile_seconds: float) -> list[LiveWorker]:
    """The workers alive now that take deployments (they consume the serving queue)."""
    return _alive(db, _SERVING_WORKERS, reconcile_seconds)


def _alive(db: Db, query: Select[Any], reconcile_seconds: float) -> list[LiveWorker]:
    horizon = utcnow() - dt.timedelta(seconds=WORKER_MISSED_BEATS * reconcile_seconds)
    rows = db.execute(query, {"horizon": horizon})
    return [
        LiveWorker(int(gpus), None if memory is None else int(memory), _decoders(decoders))
        for gpus, memory, decoders in rows
    ]


def _decoders(column: str | None) -> frozenset[str] | None:
    try:
        names = json.loads(column) if column else None
    except ValueError:
        return None
    return frozenset(str(name) for name in names) if isinstance(names, list) else None
