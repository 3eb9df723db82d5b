"""Database engines and sessions, for PostgreSQL (production, tests) and SQLite (the embedded server)."""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import orjson
from sqlalchemy import (
    ColumnElement,
    Connection,
    CursorResult,
    DateTime,
    Engine,
    Result,
    Table,
    create_engine,
    event,
    make_url,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

from relay_api.settings import Settings

T = TypeVar("T")

# What the API's queries run on: an ORM session (requests that write in a transaction, the worker),
# or a bare connection (requests that only read, or write one statement: see read_engine).
Db = Session | Connection


def iso(moment: dt.datetime | None) -> str | None:
    """ISO 8601 as `datetime.isoformat` writes it, with `Z` for UTC. Written by orjson, at a fifth of
    isoformat's CPU: a page of 100 events has 100 to write."""
    if moment is None:
        return None
    return orjson.dumps(moment, option=orjson.OPT_UTC_Z)[1:-1].decode()


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes in Python, naive UTC in the database (the same on PostgreSQL and SQLite)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(dt.UTC).replace(tzinfo=None)

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        return None if value is None else value.replace(tzinfo=dt.UTC)


class Base(DeclarativeBase):
    pass


ConnectionRole = Literal["api", "worker"]


@dataclass(frozen=True)
class Liveness:
    """How a process's PostgreSQL connections notice that the other end is gone, so that nothing
    waits on a dead or frozen peer for PostgreSQL's defaults (no bound on an idle transaction, TCP
    keepalives after 7,200 s).

    - `dead_peer_seconds`: TCP keepalives at both ends (the client's libpq and the server's
      `tcp_keepalives_*`), and a TCP user timeout for data sent and never acknowledged, give up on
      a peer that stopped answering (a lost host, a paused VM, a network cut) within about this long.
    - `idle_transaction_seconds`: the server ends a session whose transaction sat idle this long
      (`idle_in_transaction_session_timeout`), rolling it back and freeing its row locks. A worker
      frozen between an UPDATE of a job's row and its COMMIT (SIGSTOP, a paused VM, a partition)
      would otherwise hold that row locked for as long as it stays frozen; ended, it is fenced out
      as well (its COMMIT fails, and the write is tried again as its attempt, which a newer claim
      refuses). Set on the workers' connections, whose transactions are a few statements long.
    - `application_name`: who holds the connection, in `pg_stat_activity` (`relay-worker HOST:PID`).

    SQLite (the embedded server) has none of these: it is a file on this host."""

    dead_peer_seconds: float = 20.0
    idle_transaction_seconds: float | None = None
    application_name: str | None = None

    @classmethod
    def of(cls, settings: Settings, role: ConnectionRole) -> Liveness:
        """Paced by the lease, so that a worker notices a database gone, or frees a row it left
        locked, well before its lease (and so its claim on the job) lapses: a dead peer within a
        third of the lease, an idle transaction after half of it."""
        name = f"relay-{role} {socket.gethostname()}:{os.getpid()}"[:63]
        return cls(
            dead_peer_seconds=max(1.0, settings.lease_seconds / 3),
            idle_transaction_seconds=settings.lease_seconds / 2 if role == "worker" else None,
            application_name=name,
        )

    def connect_args(self, url: str) -> dict[str, Any]:
        """psycopg's connection arguments: the client's keepalives and user timeout, and the
        server's settings for this session (added to any `options` the URL gives)."""
        probes = 3
        idle = max(1, round(self.dead_peer_seconds / 2))
        interval = max(1, round(self.dead_peer_seconds / (2 * probes)))
        user_timeout_ms = max(1000, round(self.dead_peer_seconds * 1000))
        server = [
            f"-c tcp_keepalives_idle={idle}",
            f"-c tcp_keepalives_interval={interval}",
            f"-c tcp_keepalives_count={probes}",
            f"-c tcp_user_timeout={user_timeout_ms}",
        ]
        if self.idle_transaction_seconds is not None:
            server.append(
                f"-c idle_in_transaction_session_timeout={round(self.idle_transaction_seconds * 1000)}"
            )
        given = make_url(url).query.get("options")
        options = " ".join([*([given] if isinstance(given, str) else list(given or ())), *server])
        args: dict[str, Any] = {
            "connect_timeout": CONNECT_TIMEOUT_SECONDS,
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": interval,
            "keepalives_count": probes,
            "tcp_user_timeout": user_timeout_ms,
            "options": options,
        }
        if self.application_name:
            args["application_name"] = self.application_name
        return args


def make_engine(
    url: str, pool_size: int = 10, isolation_level: str | None = None, liveness: Liveness | None = None
) -> Engine:
    # `isolation_level` is set once per connection, when it is made (per checkout would cost CPU on
    # every request).
    options: dict[str, Any] = {"isolation_level": isolation_level} if isolation_level else {}
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            json_deserializer=orjson.loads,
            **options,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # No overflow: a request waits for a pooled connection rather than open one (a new PostgreSQL
    # connection costs a server process), so a process holds at most `pool_size` connections.
    # A connect timeout, so that a database behind a dead network answers "unavailable" in seconds
    # rather than hold a request (or a worker's write) for the kernel's minutes; keepalives and the
    # rest of Liveness for connections already made.
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=30,
        json_deserializer=orjson.loads,
        connect_args=(liveness or Liveness()).connect_args(url),
        **options,
    )
    _ping_when_idle(engine)
    return engine


CONNECT_TIMEOUT_SECONDS = 5


def is_outage(error: BaseException) -> bool:
    """Whether a database error means the database is away (down, restarting, unreachable, every
    connection busy) rather than that a statement is wrong: the same statement may work later."""
    if isinstance(error, OperationalError | InterfaceError | PoolTimeout):
        return True
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)


# A connection back from use within this long is trusted without a ping. SQLAlchemy's pre-ping
# costs every request a round trip (a quarter of a short read's time); a connection that just
# worked is almost surely alive, and if the database restarted meanwhile, the statement that fails
# invalidates the whole pool, so later checkouts open fresh connections.
PING_AFTER_IDLE_SECONDS = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection on checkout only when it sat idle: pre-ping for quiet moments."""

    @event.listens_for(engine, "checkin")
    def _note_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in = record.info.get("checked_in_at")
        if checked_in is not None and time.monotonic() - checked_in < PING_AFTER_IDLE_SECONDS:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as error:
            raise DisconnectionError(f"a pooled connection is gone: {error}") from error
        if not alive:
            raise DisconnectionError("a pooled connection is gone")


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    # WAL lets the API read while the worker writes; the busy timeout queues writers instead of failing.
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


_factories: dict[tuple[int, str, int, ConnectionRole], sessionmaker[Session]] = {}
_read_engines: dict[tuple[int, str, int], Engine] = {}
_read_factories: dict[tuple[int, str, int], sessionmaker[Session]] = {}
_factories_lock = threading.Lock()


def session_factory(
    settings: Settings, pool_size: int | None = None, role: ConnectionRole = "api"
) -> sessionmaker[Session]:
    """One engine per process, URL, pool size (`db_pool_size` unless given) and role; a forked
    worker child builds its own, since pools do not survive fork. A worker's connections end a
    transaction left idle for half the lease (Liveness); see `worker_session_factory`."""
    size = pool_size or settings.db_pool_size
    key = (os.getpid(), settings.database_url, size, role)
    with _factories_lock:
        factory = _factories.get(key)
        if factory is None:
            engine = make_engine(settings.database_url, size, liveness=Liveness.of(settings, role))
            factory = _factories[key] = sessionmaker(engine, expire_on_commit=False)
        return factory


def worker_session_factory(settings: Settings) -> sessionmaker[Session]:
    """The sessions a worker process writes jobs, sessions and deployments with (and its
    reconciler reads and moves them with): connections whose idle transactions the server ends."""
    return session_factory(settings, role="worker")


def unlocked(table: Table, *conditions: Any) -> ColumnElement[bool]:
    """The rows of `table` matching `conditions` that no other transaction holds locked, locked now
    by this one (PostgreSQL's FOR NO KEY UPDATE SKIP LOCKED, the lock an UPDATE takes): for the
    reconcilers' updates, which must never wait on a row. A worker frozen inside a transaction holds
    its job's row until the server ends that transaction; a reconciler waiting on it would hold up
    every job after it in the pass. A row skipped is looked at again next pass. (SQLite locks the
    whole database for a write, and waits its busy timeout.)"""
    key = table.c.id
    return key.in_(select(key).where(*conditions).with_for_update(skip_locked=True, key_share=True))


def read_engine(settings: Settings, pool_size: int | None = None) -> Engine:
    """An engine per process, URL and pool size whose statements each commit on their own: a read
    costs one round trip, with no BEGIN and ROLLBACK around it, and sees the latest commits. For
    requests that only read, or write a single statement. A pool of its own, whose connections stay
    in autocommit: switching a shared pool's connection on each checkout cost every request CPU."""
    size = pool_size or settings.db_pool_size
    key = (os.getpid(), settings.database_url, size)
    with _factories_lock:
        engine = _read_engines.get(key)
        if engine is None:
            engine = _read_engines[key] = make_engine(
                settings.database_url,
                size,
                isolation_level="AUTOCOMMIT",
                liveness=Liveness.of(settings, "api"),
            )
        return engine


def read_session_factory(settings: Settings, pool_size: int | None = None) -> sessionmaker[Session]:
    """ORM sessions on read_engine."""
    engine = read_engine(settings, pool_size)
    key = (os.getpid(), settings.database_url, pool_size or settings.db_pool_size)
    with _factories_lock:
        return _read_factories.setdefault(key, sessionmaker(engine, expire_on_commit=False))


def api_pool_sizes(pool_size: int) -> tuple[int, int]:
    """How an API process splits its `db_pool_size` connections: (transactions, reads). Most requests
    only read (or write one statement); transactions (a cancel, a session's close) are the few."""
    transactions = max(1, pool_size // 4)
    return transactions, max(1, pool_size - transactions)


_CLOCK_REFRESH_SECONDS = 60.0
_CLOCK_SAMPLES = 3
_clock_offsets: dict[int, tuple[dt.timedelta, float]] = {}


def database_now(factory: sessionmaker[Session]) -> dt.datetime:
    """The database server's time, for leases: a lease is stamped by one host and judged lapsed by
    another, so both read one clock. This process's clock plus its offset from the database's,
    measured once a minute (the last offset stands while the database is away); SQLite is on this
    host, so its clock is ours."""
    if factory.kw["bind"].dialect.name != "postgresql":
        return utcnow()
    known = _clock_offsets.get(id(factory))
    if known is None or time.monotonic() - known[1] > _CLOCK_REFRESH_SECONDS:
        try:
            with factory() as db:
                # The connection first: its checkout may open it (a process's first) or ping it, and
                # only the statement's round trip may lie between `before` and `after`, whose middle
                # is taken for the server's moment. Of a few round trips, the shortest: a process
                # descheduled inside one (a busy host) would put that middle off by up to its length.
                db.connection()
                samples = []
                for _ in range(_CLOCK_SAMPLES):
                    before = utcnow()
                    server = db.execute(text("SELECT statement_timestamp()")).scalar_one()
                    after = utcnow()
                    samples.append(
                        (after - before, server.astimezone(dt.UTC) - (before + (after - before) / 2))
                    )
            offset = min(samples, key=lambda sample: sample[0])[1]
            known = _clock_offsets[id(factory)] = (offset, time.monotonic())
        except (OperationalError, DBAPIError):
            if known is None:
                raise
    return utcnow() + known[0]


def rows_changed(result: Result[Any]) -> int:
    """How many rows an UPDATE or DELETE changed (its result is a CursorResult; the types say Result)."""
    return cast(CursorResult[Any], result).rowcount


def with_retries(operation: Callable[[], T], attempts: int = 5, first_wait: float = 0.2) -> T:
    """Run a short transaction again when the connection dropped or the database was busy; a worker's
    writes should ride out a database restart rather than lose the job's progress."""
    for attempt in range(attempts):
        try:
            return operation()
        except (OperationalError, DBAPIError) as error:
            transient = isinstance(error, OperationalError) or error.connection_invalidated
            if not transient or attempt == attempts - 1:
                raise
            time.sleep(first_wait * 2**attempt)
    raise AssertionError("unreachable")
