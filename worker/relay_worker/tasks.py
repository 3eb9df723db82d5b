"""Thin Celery tasks: each names a job and hands it to its runner."""

from __future__ import annotations

from relay_api.queue import RUN_FINE_TUNE
from relay_worker.app import app
from relay_worker.fine_tune import run_fine_tune as run


@app.task(name=RUN_FINE_TUNE, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_fine_tune(job_id: str) -> str:
    return run(job_id)
