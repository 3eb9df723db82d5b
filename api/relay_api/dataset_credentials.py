"""The password of a job's database URL, kept apart from the job until the job's snapshot.

A job whose dataset_name is `postgresql://ana:s3cret@db/shop` is stored, listed and reported as
`postgresql://ana:***@db/shop` (relay.dataset_names.redacted_url, which also hides a password
given as a query parameter); the URL as given goes in its own row (`dataset_credentials`), written
in the transaction that creates the job, read by the worker to take the job's snapshot of the
database, and deleted once the snapshot is taken (relay_worker.database_snapshot).
"""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from relay.dataset_names import redacted_url
from relay.sft import status as st
from relay_api.db import Db
from relay_api.models import dataset_credentials, fine_tunes


def masked(url: str) -> tuple[str, str | None]:
    """A database URL as a job stores it, and the URL to keep apart (None when it holds no secret):
    postgresql://ana:s3cret@db/shop -> (postgresql://ana:***@db/shop, postgresql://ana:s3cret@db/shop)."""
    shown = redacted_url(url)
    return shown, (None if shown == url else url)


def keep_secret_url(db: Db, job_id: str, url: str) -> None:
    """Hold a new job's URL until its snapshot (in the caller's transaction: with the job)."""
    db.execute(dataset_credentials.insert().values(job_id=job_id, url=url))


def secret_url(db_sessions: sessionmaker[Session], job_id: str) -> str | None:
    """The job's database URL as given, while it is held (None once the snapshot is taken)."""
    with db_sessions() as db:
        found = db.scalar(select(dataset_credentials.c.url).where(dataset_credentials.c.job_id == job_id))
    return None if found is None else str(found)


def forget_secret_url(db_sessions: sessionmaker[Session], job_id: str) -> None:
    with db_sessions() as db:
        db.execute(delete(dataset_credentials).where(dataset_credentials.c.job_id == job_id))
        db.commit()


def forget_ended_jobs_urls(db_sessions: sessionmaker[Session]) -> int:
    """Delete the URLs held for jobs that ended without taking their snapshot (cancelled while
    queued, or ended in error first): nothing will read them again. The reconciler's, every pass."""
    ended = select(fine_tunes.c.id).where(fine_tunes.c.status.in_(sorted(st.TERMINAL)))
    with db_sessions() as db:
        removed = db.execute(delete(dataset_credentials).where(dataset_credentials.c.job_id.in_(ended)))
        db.commit()
    return int(getattr(removed, "rowcount", 0) or 0)
