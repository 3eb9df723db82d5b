"""The Celery worker, started by ``python -m relay_worker -c 1`` (its command line: relay_worker.command).

One process per GPU (``-c N`` with ``RELAY_WORKER_GPUS``), one task (a job or a session) at a time each: late
acknowledgement, no prefetch beyond the task at hand, and a message that comes back if its
process dies. The job row, claimed with a lease, decides whether a delivery trains; see
relay_worker.lifecycle. Each worker also runs the reconciler in a thread of its main process.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from typing import Any

import redis
from celery import signals

from relay_api.db import database_now, is_outage, utcnow, worker_session_factory
from relay_api.queue import RUN_DEPLOYMENT, RUN_FINE_TUNE, make_celery
from relay_api.settings import get_settings
from relay_worker import deployment_lifecycle, heartbeat, session_lifecycle, shutdown, webhook_dispatch
from relay_worker.fine_tune import worker_name
from relay_worker.lifecycle import reconcile

log = logging.getLogger("relay_worker")

settings = get_settings()
app = make_celery(settings, "relay-worker")
app.conf.update(
    include=["relay_worker.tasks"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_concurrency=1,
    # A Redis blip must not kill hours of training; the lease decides who owns the job.
    worker_cancel_long_running_tasks_on_connection_loss=False,
    worker_send_task_events=False,
)
if settings.broker_url.startswith("sqla+"):
    # The SQL broker (the embedded server) has no fan-out exchanges for remote control.
    app.conf.worker_enable_remote_control = False


class Reconciler(threading.Thread):
    """Every `reconcile_seconds`: resume jobs whose lease lapsed, publish jobs the broker never got,
    fail jobs out of attempts, finish cancels whose worker is gone; end sessions whose worker is gone
    or that no worker started in time; restart deployments whose worker is gone; write and send
    webhook deliveries of jobs that ended (relay_worker.webhook_dispatch, on threads of its own)."""

    def __init__(self, takes_jobs: bool = True, serves_deployments: bool = False) -> None:
        super().__init__(name="relay-reconciler", daemon=True)
        self.stopping = threading.Event()
        self.broker = BrokerWatch(settings.broker_url)
        # Heartbeats say what a worker offers (its slots, its GPUs' memory) and to what: a worker that
        # takes only deployments is no place to train, and one that takes no deployments none to serve.
        self.takes_jobs, self.serves_deployments = takes_jobs, serves_deployments

    def run(self) -> None:
        db_sessions = worker_session_factory(settings)
        name, started_at = worker_name(), utcnow()
        memory = heartbeat.this_workers_gpu_memory(settings)
        decoders = heartbeat.video_decoders()
        self._beat(db_sessions, name, started_at, memory, decoders)
        # Until then, leases that lapsed without a word are not judged: after a database outage, the
        # workers it stopped need a lease's time to give their jobs back (which does not count), and
        # the workers that served deployments through it to renew their leases.
        judge_leases_at = 0.0
        webhooks = webhook_dispatch.Dispatcher(db_sessions, settings)
        while not self.stopping.wait(settings.reconcile_seconds):
            self._beat(db_sessions, name, started_at, memory, decoders)
            judge = time.monotonic() >= judge_leases_at
            try:
                report = reconcile(db_sessions, settings, publish, self.broker.started_at(), judge)
            except Exception as error:
                if is_outage(error):
                    judge_leases_at = time.monotonic() + settings.lease_seconds + settings.reconcile_seconds
                log.exception("reconciler pass failed; trying again in %ss", settings.reconcile_seconds)
                continue
            for kind in ("published", "resumed", "failed", "cancelled"):
                for job_id in getattr(report, kind):
                    log.info("reconciler: %s %s", kind, job_id)
            try:
                for session_id in session_lifecycle.reconcile(db_sessions, settings):
                    log.info("reconciler: ended session %s", session_id)
            except Exception:
                log.exception("reconciler pass over sessions failed")
            try:
                for deployment_id in deployment_lifecycle.reconcile(
                    db_sessions, settings, publish_deployment, judge
                ):
                    log.info("reconciler: restarted, ended or published deployment %s", deployment_id)
            except Exception:
                log.exception("reconciler pass over deployments failed")
            try:
                webhooks.run_pass()
            except Exception:
                log.exception("reconciler pass over webhooks failed")
        webhooks.close()

    def _beat(
        self, sessions: Any, name: str, started_at: Any, gpu_memory: int | None, decoders: list[str] | None
    ) -> None:
        try:
            heartbeat.beat(
                sessions,
                name,
                started_at,
                settings.worker_slots,
                gpu_memory,
                decoders,
                takes_jobs=self.takes_jobs,
                serves_deployments=self.serves_deployments,
            )
        except Exception:  # only /metrics' count of live workers depends on it
            log.warning("could not write this worker's heartbeat", exc_info=True)


class BrokerWatch:
    """When the broker last started, from Redis's INFO; a restart (a new run id) is logged. Redis
    without persistence forgets its queues when it restarts, and the reconciler publishes what it
    forgot at once. None for other brokers, or when Redis cannot be asked."""

    def __init__(self, broker_url: str) -> None:
        self.client = (
            redis.Redis.from_url(broker_url) if broker_url.startswith(("redis://", "rediss://")) else None
        )
        self.run_id: str | None = None

    def started_at(self) -> dt.datetime | None:
        if self.client is None:
            return None
        try:
            info = self.client.info("server")
        except redis.RedisError:
            log.warning("cannot ask the broker when it started", exc_info=True)
            return None
        if self.run_id is not None and info["run_id"] != self.run_id:
            log.warning(
                "the broker restarted (run id %s); publishing the jobs it may have lost", info["run_id"]
            )
        self.run_id = info["run_id"]
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=int(info["uptime_in_seconds"]))


def publish(job_id: str) -> None:
    app.send_task(RUN_FINE_TUNE, args=[job_id], queue=settings.fine_tune_queue)


def publish_deployment(deployment_id: str) -> None:
    app.send_task(RUN_DEPLOYMENT, args=[deployment_id], queue=settings.serving_queue)


_reconciler: Reconciler | None = None


@signals.worker_ready.connect
def _start_reconciler(**_: Any) -> None:
    global _reconciler
    _reconciler = Reconciler(
        takes_jobs=_consumes(settings.fine_tune_queue), serves_deployments=_consumes(settings.serving_queue)
    )
    _reconciler.start()


def _consumes(queue: str) -> bool:
    """Whether this worker consumes `queue` (the recipe jobs' unless started for deployments only;
    the serving queue only when named)."""
    queues = app.amqp.queues
    return queue in set(queues.consume_from or queues)


@signals.worker_shutting_down.connect
def _hand_jobs_back(**_: Any) -> None:
    shutdown.begin()


@signals.worker_shutdown.connect
def _stop_reconciler(**_: Any) -> None:
    if _reconciler is not None:
        _reconciler.stopping.set()


@signals.worker_init.connect
def _load_before_the_pool_forks(**_: Any) -> None:
    """What each pool process would otherwise load on its first task, before it claims the job,
    loaded once in the main process so that every pool process inherits it: the database driver
    (psycopg and SQLAlchemy's dialect for it, imported by the first engine: about 0.1 s, several
    times that on a loaded host) and this host's GPUs (nvidia-smi, kept for the process). This
    engine opens no connection; each pool process builds its own (relay_api.db.session_factory)."""
    worker_session_factory(settings)
    heartbeat.this_workers_gpu_memory(settings)


@signals.worker_process_init.connect
def _connect_early(**_: Any) -> None:
    """Open this pool process's first database connection now, on a thread (a start must not wait
    on the database, nor fail for it), rather than on its first task's claim: a connection, the
    dialect's first queries and the database clock's offset (relay_api.db.database_now)."""
    threading.Thread(target=_connect, name="relay-connect-early", daemon=True).start()


def _connect() -> None:
    try:
        database_now(worker_session_factory(settings))
    except Exception:  # the first task connects (and retries) as it always did
        log.info("could not connect to the database at the start; the first task will", exc_info=True)


@signals.worker_process_init.connect
def _pin_gpu(**_: Any) -> None:
    """Give each pool process its own GPU when RELAY_WORKER_GPUS lists them."""
    gpus = [g.strip() for g in settings.worker_gpus.split(",") if g.strip()]
    if not gpus:
        return
    from billiard.process import current_process

    index = getattr(current_process(), "index", 0) or 0
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
