"""Whether this worker is shutting down, shared by its main process and its pool processes.

A warm shutdown (SIGTERM, as `docker compose stop` sends) lets a running task finish, which for a
training job may be hours. Instead the main process raises this flag; the running job stops at its
next step and gives the job back, so another worker resumes it from its last checkpoint at once.
The flag lives in shared memory made before the pool forks.
"""

from __future__ import annotations

import multiprocessing

_flag = multiprocessing.RawValue("b", 0)


def begin() -> None:
    _flag.value = 1


def under_way() -> bool:
    return bool(_flag.value)
