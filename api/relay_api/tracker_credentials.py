"""The keys given with a job's integrations (a W&B API key, an MLflow token), kept apart from the job
until it ends.

A recipe's ``integrations`` may carry ``wandb.api_key`` and ``mlflow.token`` (relay.integrations).
The job is stored, listed and reported without them; the keys, by the environment variable each
stands for (``WANDB_API_KEY``, ``MLFLOW_TRACKING_TOKEN``), go in their own row
(``tracker_credentials``), written in the transaction that creates the job. Every attempt's worker
reads them for the job's trackers (they log on each resume), and the reconciler deletes them once
the job has ended. Like a database URL's password (relay_api.dataset_credentials), they are never
in an answer, an event, a log line or a file of the job.
"""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from relay.sft import status as st
from relay_api.db import Db
from relay_api.models import fine_tunes, tracker_credentials


def keep_tracker_secrets(db: Db, job_id: str, secrets: dict[str, str]) -> None:
    """Hold a new job's keys (in the caller's transaction: with the job); nothing when none."""
    if secrets:
        db.execute(tracker_credentials.insert().values(job_id=job_id, secrets=secrets))


def tracker_secrets_of(db_sessions: sessionmaker[Session], job_id: str) -> dict[str, str]:
    """The job's keys, by environment variable ({} when none were given, or once it has ended)."""
    with db_sessions() as db:
        found = db.scalar(select(tracker_credentials.c.secrets).where(tracker_credentials.c.job_id == job_id))
    return {str(name): str(value) for name, value in (found or {}).items()}


def forget_ended_jobs_secrets(db_sessions: sessionmaker[Session]) -> int:
    """Delete the keys of jobs that have ended: no attempt will log again. The reconciler's, every pass."""
    ended = select(fine_tunes.c.id).where(fine_tunes.c.status.in_(sorted(st.TERMINAL)))
    with db_sessions() as db:
        removed = db.execute(delete(tracker_credentials).where(tracker_credentials.c.job_id.in_(ended)))
        db.commit()
    return int(getattr(removed, "rowcount", 0) or 0)
