"""`python -m relay_worker`: run a Relay worker (relay_worker.command), its settings (database,
broker, queues) from the environment as relay_api.settings reads them.

The process becomes the Celery worker (exec), so a signal sent to it reaches Celery itself: SIGTERM
is the warm shutdown that hands a running job back.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from relay_worker.command import worker_command


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m relay_worker", description="Run a Relay worker.")
    parser.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=1,
        help="worker processes, one job or session at a time each (one per GPU); default 1",
    )
    parser.add_argument(
        "--queues",
        "-Q",
        default="",
        help="comma-separated queues to consume; default: recipe jobs' and training sessions' "
        "(RELAY_FINE_TUNE_QUEUE, RELAY_SESSION_QUEUE); deployments' (RELAY_SERVING_QUEUE) only when named",
    )
    parser.add_argument("--loglevel", "-l", default="INFO", help="Celery's log level; default INFO")
    parser.add_argument(
        "--without-heartbeat",
        action="store_true",
        help="no Celery event heartbeats (the worker still beats in the database)",
    )
    args = parser.parse_args(argv)
    command = worker_command(
        concurrency=args.concurrency,
        queues=[name for name in args.queues.split(",") if name],
        loglevel=args.loglevel,
        heartbeat=not args.without_heartbeat,
    )
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
