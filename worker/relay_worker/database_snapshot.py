"""A database job's snapshot: the tables of a job whose dataset_name is a database URL, read once.

The first attempt reads the database in one transaction into the job's directory (the layout of a
database directory, with the row counts in its snapshot.json), reports a `snapshot` event, and
forgets the URL's password; it then trains on the snapshot like on any database directory. Every
later attempt (a retry, a resume after a lost worker) finds the snapshot there and reads it, so a
resumed job takes the steps an uninterrupted one would even if the database changed meanwhile.

The job's row and events hold the URL with its password masked; the URL as given waits in
`dataset_credentials` until the snapshot is taken (relay_api.dataset_credentials).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from relay.dataset_names import is_database_url
from relay.events import Event
from relay_api.dataset_credentials import forget_secret_url, secret_url
from relay_engine.errors import DatasetError
from relay_engine.families.rtj.database import SNAPSHOT_FILE
from relay_engine.families.rtj.sql import snapshot_database

# Where in the job's directory the snapshot is: beside checkpoints/ and output/.
SNAPSHOT_DIR = "database"


def with_snapshot(
    config: Mapping[str, Any],
    db_sessions: sessionmaker[Session],
    job_id: str,
    work_dir: Path,
    on_event: Callable[[Event], None],
) -> dict[str, Any]:
    """The job's config as the engine should run it: a database URL replaced by the job's snapshot
    (taken now if no attempt has taken it yet); any other config as it is."""
    name = config.get("dataset_name")
    if not isinstance(name, str) or not is_database_url(name):
        return dict(config)
    target = work_dir / SNAPSHOT_DIR
    if not (target / SNAPSHOT_FILE).is_file():
        tasks_dir = config.get("tasks_dir")
        url = _url_to_read(name, secret_url(db_sessions, job_id))
        taken = snapshot_database(url, target, Path(tasks_dir).expanduser() if tasks_dir else None)
        on_event(taken.event(step=0))
        forget_secret_url(db_sessions, job_id)
    # The snapshot holds the job's tasks too (a tasks_dir's are copied in): it is all the job reads.
    return {**config, "dataset_name": str(target), "tasks_dir": None}


def _url_to_read(stored: str, secret: str | None) -> str:
    """The URL to connect with: the one given at create while it is held, else the stored one,
    unless that had a password masked (the given one is gone: nothing can read the database)."""
    if secret is not None:
        return secret
    if "***" in stored:  # redacted_url's mask: the job was given a password
        raise DatasetError(
            stored,
            "the password given with this job's dataset_name is no longer held (it is kept only "
            "until the job's snapshot of the database is taken); create the job again",
        )
    return stored
