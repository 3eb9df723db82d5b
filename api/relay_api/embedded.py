"""The embedded service for a laptop: `relay server`.

Everything under one data directory (``RELAY_HOME``, else ``~/.relay``): a SQLite database, a
SQLite-backed Celery broker (kombu's SQLAlchemy transport, so no server is needed), training
sessions' calls and results in the SQLite database too (relay_api.channel_sql), job work
directories, the worker's log, and ``client.json`` with the URL and a local API key, where the SDK
and the CLI look for them. The API runs in this process, one worker (jobs and sessions, one at
a time) in a child process, and a second worker in another for deployments, so that serving a
model does not hold up training.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import uvicorn
from sqlalchemy import select

from relay import client_config
from relay_api import host_gpus, keys, migrate
from relay_api.app import create_app
from relay_api.db import session_factory
from relay_api.models import ApiKey
from relay_api.settings import Settings

LOCAL_USER = "local"


def serve(host: str, port: int, log: Callable[[str], None] = print) -> None:
    home = client_config.data_dir().expanduser().absolute()
    os.environ["RELAY_HOME"] = str(home)  # the worker process reads the same settings
    os.environ.setdefault("RELAY_METRICS", "true")  # a laptop's /metrics tells no one else anything
    # A laptop's webhook receivers are its own (localhost): no deployment network to keep them out of.
    os.environ.setdefault("RELAY_WEBHOOK_PRIVATE_ADDRESSES", "true")
    # The API and its worker read one disk: a dataset directory that is not there is refused at once.
    os.environ.setdefault("RELAY_API_SHARES_WORKERS_DISK", "true")
    # Its workers train on this machine: without a GPU here, a pi05 job is refused from the first
    # second, not only once the worker's first heartbeat says it trains on the CPU.
    os.environ.setdefault("RELAY_CPU_WORKERS_ONLY", "false" if host_gpus.gpu_memory(None) else "true")
    settings = Settings()
    home.mkdir(parents=True, exist_ok=True)
    _check_port_free(host, port)

    migrate.upgrade(settings.database_url)
    client_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    base_url = f"http://{client_host}:{port}"
    key = _local_key(settings)
    key_file = client_config.write_client_file(home, base_url, key)

    # uvicorn re-raises the signal that stopped it once it is done; make SIGTERM an exception here so
    # the workers are stopped too (SIGINT is already KeyboardInterrupt). Set before they start, so
    # that a SIGTERM while they start stops them as well.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    worker = WorkerProcess(settings, home / "worker.log")
    serving_worker = WorkerProcess(settings, home / "serving-worker.log", queues=[settings.serving_queue])
    try:
        worker.start()
        serving_worker.start()
        log(f"Relay is serving at {base_url}")
        log(f"console: {base_url}/ (sign in with the key below); API docs: {base_url}/docs")
        # The local user's own key on their own machine: printed, so the console can be opened at once.
        log(f"API key for user '{LOCAL_USER}': {key}")
        log(f"data: {home}; the key is saved in {key_file}, where the SDK and CLI read it")
        log(f"worker logs: {worker.log_path}, {serving_worker.log_path}; press Ctrl-C to stop")
        uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")
    except KeyboardInterrupt:
        pass
    finally:
        serving_worker.stop()
        worker.stop()


def _term_when_parent_dies() -> None:
    """In the worker's process before it runs (Linux): SIGTERM when the server that started it ends
    however it ends (SIGKILL, a crash), so that no worker outlives its server to take the jobs of
    the next one with the same data directory. SIGTERM is the worker's warm shutdown: a running job
    is handed back by its lease, as when the server stops it."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            message = f"error: cannot listen on {host}:{port} ({error.strerror}); pick another --port"
            raise SystemExit(message) from None


def _local_key(settings: Settings) -> str:
    """The key saved by a previous start if it still works, else a new one for the local user."""
    saved = client_config.resolve().api_key
    with session_factory(settings)() as db:
        if saved:
            known = db.scalar(
                select(ApiKey.id).where(ApiKey.key_hash == keys.hash_key(saved), ApiKey.revoked_at.is_(None))
            )
            if known is not None:
                return saved
        return keys.create_key(db, LOCAL_USER).key


class WorkerProcess:
    """One Celery worker in a child process, started again if it dies while the server runs."""

    def __init__(self, settings: Settings, log_path: Path, queues: list[str] | None = None) -> None:
        self.settings = settings
        self.log_path = log_path
        self.queues = queues or []  # none: the worker's default queues, jobs' and sessions'

        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="worker-watcher", daemon=True)

    def command(self) -> list[str]:
        # `python -m relay_worker` rather than its command line: the API never imports the worker.
        # The child reads the same settings (queues included) from the environment.
        command = [sys.executable, "-m", "relay_worker", "--concurrency", "1", "--without-heartbeat"]
        return command + (["--queues", ",".join(self.queues)] if self.queues else [])

    def start(self) -> None:
        self._spawn()
        self._watcher.start()

    def _spawn(self) -> None:
        log_file = open(self.log_path, "ab")  # noqa: SIM115 (the child keeps it)
        self._process = subprocess.Popen(
            self.command(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_term_when_parent_dies if sys.platform == "linux" else None,
        )
        log_file.close()

    def _watch(self) -> None:
        while not self._stopping.wait(2.0):
            if self._process is not None and self._process.poll() is not None:
                code = self._process.returncode
                print(f"the worker exited ({code}); starting it again; see {self.log_path}", file=sys.stderr)
                time.sleep(1.0)
                if not self._stopping.is_set():
                    self._spawn()

    def stop(self) -> None:
        self._stopping.set()
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # a warm shutdown: the running task is given back by lease
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
