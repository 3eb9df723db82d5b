"""A worker's heartbeat row: written by the reconciler thread of its main process each pass, so
/metrics can count the workers that are alive, busy or not."""

from __future__ import annotations

import datetime as dt
import json
import subprocess

from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from relay_api.db import utcnow
from relay_api.models import WorkerHeartbeat

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


def gpu_memory(visible: str | None) -> int | None:
    """Bytes of the smallest GPU this host shows its jobs (CUDA_VISIBLE_DEVICES when set), from
    nvidia-smi, which leaves CUDA uninitialised in this process (its pool processes fork from it
    and must initialise CUDA themselves). None when the host has no NVIDIA GPU."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    sizes: dict[str, int] = {}
    for line in listed.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and parts[2].isdigit():
            mebibytes = int(parts[2]) * 2**20
            sizes[parts[0]] = sizes[parts[1]] = mebibytes
    wanted = [d.strip() for d in visible.split(",") if d.strip()] if visible else list(sizes)
    shown = [sizes[d] for d in wanted if d in sizes]
    return min(shown) if shown else None
