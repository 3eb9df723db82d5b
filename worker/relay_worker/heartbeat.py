"""A worker's heartbeat row: written by the reconciler thread of its main process each pass, so
/metrics can count the workers that are alive, busy or not."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os

from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from relay_api.db import utcnow
from relay_api.host_gpus import gpu_memory
from relay_api.models import WorkerHeartbeat
from relay_api.settings import Settings

# Rows of workers gone this long are removed (each start of a worker process writes a new one).
FORGET_AFTER = dt.timedelta(days=1)


def beat(
    sessions: sessionmaker[Session],
    name: str,
    started_at: dt.datetime,
    gpus: int = 1,
    gpu_memory: int | None = None,
    video_decoders: list[str] | None = None,
    *,
    takes_jobs: bool = True,
    serves_deployments: bool = False,
) -> None:
    """Note that worker `name` is alive now, and gives a job `gpus` GPUs (processes) of
    `gpu_memory` bytes each (None: CPU slots, no GPU), and decodes `video_decoders` (codec names);
    and which work it takes: recipe jobs (and sessions), deployments, or both."""
    now = utcnow()
    decoders = None if video_decoders is None else json.dumps(video_decoders)
    with sessions() as session:
        row = session.get(WorkerHeartbeat, name)
        if row is None:
            session.add(
                WorkerHeartbeat(
                    name=name,
                    started_at=started_at,
                    seen_at=now,
                    gpus=gpus,
                    gpu_memory=gpu_memory,
                    video_decoders=decoders,
                    takes_jobs=takes_jobs,
                    serves_deployments=serves_deployments,
                )
            )
            session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.seen_at < now - FORGET_AFTER))
        else:
            row.seen_at = now
            row.gpus = gpus
            row.gpu_memory = gpu_memory
            row.video_decoders = decoders
            row.takes_jobs = takes_jobs
            row.serves_deployments = serves_deployments
        session.commit()


def video_decoders() -> list[str] | None:
    """The video codecs this host's decoder library (PyAV's FFmpeg) reads; None if it cannot say."""
    try:
        from relay_engine.datasets.video import video_decoders as listed

        return listed()
    except Exception:  # no engine or no PyAV here: the API then assumes nothing about this worker
        return None


def this_workers_gpu_memory(settings: Settings) -> int | None:
    """Bytes of each GPU this worker gives a job (RELAY_WORKER_GPU_MEMORY_GB, else nvidia-smi for
    RELAY_WORKER_GPUS or CUDA_VISIBLE_DEVICES); None for a worker that trains on its CPU. What it
    reports in its heartbeats and holds a job it takes against (relay_worker.admission)."""
    if settings.worker_gpu_memory_gb:
        return int(settings.worker_gpu_memory_gb * 10**9)
    return _listed_once(settings.worker_gpus or os.environ.get("CUDA_VISIBLE_DEVICES"))


# nvidia-smi takes a moment; a host's GPUs do not change while the worker runs.
_listed_once = functools.cache(gpu_memory)
