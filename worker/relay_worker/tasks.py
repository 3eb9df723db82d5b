"""Thin Celery tasks: each names a job, a session or a deployment and hands it to its runner."""

from __future__ import annotations

from relay_api.queue import RUN_DEPLOYMENT, RUN_FINE_TUNE, RUN_SESSION
from relay_worker.app import app, publish, publish_deployment
from relay_worker.deployment import run_deployment as serve
from relay_worker.fine_tune import run_fine_tune as run
from relay_worker.session import run_session as host


@app.task(name=RUN_FINE_TUNE, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_fine_tune(job_id: str) -> str:
    return run(job_id, publish=publish)


# Acknowledged late too, so that a process hosting a session reserves no other message meanwhile. A
# message delivered again (its worker died) finds the session taken or ended, and does nothing.
@app.task(name=RUN_SESSION, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_session(session_id: str) -> str:
    return host(session_id)


# A deployment holds its process until it ends; acknowledged late, as a session is. A message
# delivered again finds it held (or ended) and does nothing; a lost worker's deployment is put back
# to starting and published again by the reconciler (relay_worker.deployment_lifecycle).
@app.task(name=RUN_DEPLOYMENT, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_deployment(deployment_id: str) -> str:
    return serve(deployment_id, publish=publish_deployment)
