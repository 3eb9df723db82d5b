"""The real service for tests: a dedicated PostgreSQL database, a Redis database number, the API
served by uvicorn on loopback, and Celery worker processes, all started once per test session and
shared by tests/service and tests/sdk (through `shared_stack`).

Settings are short so faults show quickly: checkpoints every 10 steps, 3 s leases renewed every
0.5 s, a reconciler pass every second, sessions idle after 4 s, webhooks retried every pass. The
workers take both queues (jobs and training sessions).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import uvicorn
from sqlalchemy.orm import Session, sessionmaker

from relay_api import keys, migrate
from relay_api.app import create_app
from relay_api.db import session_factory
from relay_api.settings import Settings
from relay_worker.command import worker_command
from tests.isolation import RedisServer, free_port, run_database_name

PG_ADMIN = os.environ.get("RELAY_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
SERVICE_DB = run_database_name("service")
PARKED_QUEUE = "relay.parked"
WORKER_READY_SECONDS = 180.0


def pg_url(database: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + database


def recreate_database(name: str) -> str:
    """A fresh, empty PostgreSQL database; returns its URL."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    return pg_url(name)


def drop_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll until `condition()` is truthy; return its value, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class ApiServer:
    """The API app served by uvicorn in a thread of the test process, on a loopback port."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="api", daemon=True)
        self._thread.start()
        wait_for(lambda: self._server.started, 30, "the API to start")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class WorkerProcess:
    """A worker of one process (relay_worker.command) in its own process group (so a test can SIGKILL all
    of it)."""

    def __init__(self, env: dict[str, str], log_path: Path, queues: tuple[str, ...] = ()) -> None:
        self.env = env
        self.log_path = log_path
        self.queues = queues  # none: the default queues, jobs' and sessions'

        self.process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    def start(self) -> None:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                worker_command(concurrency=1, heartbeat=False, queues=self.queues),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.process is not None and self.process.poll() is None, (
                "the worker exited:\n" + self.log_tail()
            )
            return "ready." in self.log_since_start()

        wait_for(ready, WORKER_READY_SECONDS, "the Celery worker to be ready", every=0.2)

    def log_since_start(self) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes at once, as a crashed machine would."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def freeze(self) -> None:
        """SIGSTOP the worker and its pool processes at once, as a paused VM: it holds its
        connections and does nothing, its heartbeats included, until `thaw`."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after `freeze`: the worker goes on where it stopped."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    def shut_down(self, timeout: float = 120) -> int:
        """SIGTERM to the main process only, as `docker compose stop` does; returns its exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class Stack:
    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="relay-service-tests-")
        self.root = Path(self._tmp.name)
        self.database_url = recreate_database(SERVICE_DB)
        self.redis = RedisServer()
        self.env_settings = {
            "RELAY_HOME": str(self.root / "home"),
            "RELAY_DATABASE_URL": self.database_url,
            "RELAY_BROKER_URL": self.redis.url,
            "RELAY_CHECKPOINT_EVERY": "10",
            "RELAY_LEASE_SECONDS": "3",
            "RELAY_HEARTBEAT_SECONDS": "0.5",
            "RELAY_RECONCILE_SECONDS": "1",
            "RELAY_MAX_ATTEMPTS": "3",
            # Parked jobs (tests/service/test_api.py) must stay parked however long the session runs.
            "RELAY_REPUBLISH_SECONDS": "86400",
            "RELAY_EVENTS_POLL_SECONDS": "0.1",
            "RELAY_AUTH_CACHE_SECONDS": "0",
            # The stack's workers are CPU processes standing in for GPU hosts: tests queue pi05
            # jobs (left parked, never trained here), which CPU-only workers would have refused.
            "RELAY_ALLOW_CPU_FULL_SIZE": "true",
            "RELAY_CACHE_DIR": str(self.root / "cache"),
            # Training sessions close after 4 s without contact (the SDK's heartbeats come every second).
            "RELAY_SESSION_IDLE_SECONDS": "4",
            # /metrics, scraped by tests/service/test_metrics.py.
            "RELAY_METRICS": "true",
            # A gang's rendezvous (tests/service/test_gang_jobs.py): every "host" is this machine.
            "RELAY_WORKER_ADDRESS": "127.0.0.1",
            # A gang that cannot form holds a worker this long (300 s by default): a gang job left
            # behind by a failed test must not hold the shared worker from every later test.
            "RELAY_GANG_WAIT_SECONDS": "60",
            # Webhooks (tests/service/test_webhooks.py): a failed delivery is sent again at the next
            # reconciler pass, and an attempt gives up on a receiver after 2 s.
            "RELAY_WEBHOOK_RETRY_SECONDS": "0.5",
            "RELAY_WEBHOOK_TIMEOUT_SECONDS": "2",
            # The tests' receivers listen on loopback (test_webhook_addresses.py covers the refusal).
            "RELAY_WEBHOOK_PRIVATE_ADDRESSES": "true",
        }
        self.settings = Settings(
            **{
                k.removeprefix("RELAY_").lower(): v
                for k, v in self.env_settings.items()
                if k != "RELAY_CACHE_DIR"
            }
        )
        self.settings.home.mkdir(parents=True)
        migrate.upgrade(self.database_url)
        self.sessions: sessionmaker[Session] = session_factory(self.settings)
        self._api: ApiServer | None = None
        self._parked_api: ApiServer | None = None
        self._worker: WorkerProcess | None = None
        self._standbys: list[WorkerProcess] = []  # stopped with the stack, even if a test failed first
        self._lock = threading.Lock()

    @property
    def api_url(self) -> str:
        with self._lock:
            if self._api is None:
                self._api = ApiServer(self.settings)
            return self._api.url

    @property
    def parked_api_url(self) -> str:
        """The API again, but publishing to queues no worker reads: its jobs stay queued, and its
        training sessions starting."""
        with self._lock:
            if self._parked_api is None:
                self._parked_api = ApiServer(
                    self.settings.model_copy(
                        update={"fine_tune_queue": PARKED_QUEUE, "session_queue": PARKED_QUEUE + "-sessions"}
                    )
                )
            return self._parked_api.url

    def worker(self) -> WorkerProcess:
        """The shared worker, started on first use and again if a test killed it."""
        with self._lock:
            if self._worker is None:
                env = {**os.environ, **self.env_settings}
                self._worker = WorkerProcess(env, self.root / "worker.log")
            if self._worker.process is None or self._worker.process.poll() is not None:
                self._worker.start()
                self._worker.wait_ready()
            return self._worker

    def stop_worker(self) -> None:
        """Stop the shared worker (the next `worker()` starts it again): a test that must know which
        workers read the jobs' queue."""
        with self._lock:
            if self._worker is not None:
                self._worker.stop()

    def start_standby_worker(self, queues: tuple[str, ...] = (), **settings: str) -> WorkerProcess:
        """A second worker, starting now (not waited for); `adopt` makes it the shared one.

        `queues`: the queues it takes (none: jobs' and sessions', as the shared worker); `settings`
        are its own RELAY_ variables (RELAY_WORKER_SLOTS="2", say)."""
        standby = WorkerProcess(
            {**os.environ, **self.env_settings, **settings},
            self.root / f"worker-{uuid.uuid4().hex[:6]}.log",
            queues,
        )
        standby.start()
        self._standbys.append(standby)
        return standby

    def adopt(self, worker: WorkerProcess) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
            self._worker = worker

    def dataset(self, name: str = "tiny", **options: Any) -> Path:
        """A small synthetic LeRobot dataset (written once per name), as a local directory."""
        path = self.root / "datasets" / name
        if not path.exists():
            from relay_engine.datasets.synth import write_synthetic_dataset

            options = {"episodes": 4, "episode_length": (20, 30), **options}
            write_synthetic_dataset(path, **options)
        return path

    def new_user(self) -> tuple[str, str]:
        """A fresh user and key: (name, key)."""
        with self.sessions() as session:
            new = keys.create_key(session, f"user-{uuid.uuid4().hex[:10]}")
        return new.user, new.key

    def stop(self) -> None:
        for worker in [self._worker, *self._standbys]:
            if worker is not None:
                worker.stop()
        for api in (self._api, self._parked_api):
            if api is not None:
                api.stop()
        self.sessions.kw["bind"].dispose()
        drop_database(SERVICE_DB)
        self.redis.close()
        self._tmp.cleanup()


_stack: Stack | None = None
_holders = 0


@contextlib.contextmanager
def shared_stack() -> Iterator[Stack]:
    """One Stack for the whole session, whichever test directories ask for it."""
    global _stack, _holders
    if _stack is None:
        _stack = Stack()
    _holders += 1
    try:
        yield _stack
    finally:
        _holders -= 1
        if _holders == 0:
            _stack.stop()
            _stack = None
