"""What stands between a queued job and its claim on a fresh worker.

A pool process used to import the database driver, open its first connection and measure the
database clock on its first task, before the claim: about 0.1 s on an idle host, several times that
on a busy one, paid by every worker's first job (bench/bench_api.py --claims-only). The worker now
does that before a job arrives (relay_worker.app), and the clock's offset leaves the time to
connect out (relay_api.db.database_now)."""

from __future__ import annotations

import socket
import time
from typing import Any

import psutil
import psycopg
from sqlalchemy import event
from sqlalchemy.orm import sessionmaker

from relay_api.db import database_now, make_engine, utcnow
from tests.service.stack import Stack, wait_for


def test_a_pool_process_connects_to_the_database_before_its_first_task(stack: Stack) -> None:
    # A worker on a queue nobody publishes to: it never runs a task.
    worker = stack.start_standby_worker(queues=("relay.test-claim-path-idle",))
    try:
        worker.wait_ready()
        assert worker.process is not None
        children = psutil.Process(worker.process.pid).children()
        assert len(children) == 1, children
        name = f"relay-worker {socket.gethostname()}:{children[0].pid}"[:63]

        def connected() -> bool:
            with psycopg.connect(stack.database_url, autocommit=True) as watch:
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
                ).fetchone()
            return row is not None and row[0] > 0

        wait_for(connected, 30, f"a connection of the pool process ({name})")
        assert "could not connect" not in worker.log_since_start()
    finally:
        worker.stop()


def test_the_database_clock_offset_leaves_out_the_time_to_connect(stack: Stack) -> None:
    """A process's first database_now opens its connection. This host's clock is the database's
    (the offset is about nothing); timing the connection with the statement took half of it for an
    offset, and stamped leases and started_at that much late."""
    engine = make_engine(stack.database_url, 1)

    def slow_connect(*_: Any) -> None:
        time.sleep(0.4)

    event.listen(engine, "connect", slow_connect)
    try:
        moment = database_now(sessionmaker(engine))
        assert abs((moment - utcnow()).total_seconds()) < 0.1
    finally:
        engine.dispose()
