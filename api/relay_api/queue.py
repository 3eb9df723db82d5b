"""The Celery side the API and the workers share: the app's settings, task names, publishing.

Two queues on the same workers, recipe jobs and training sessions, and a third, deployments, on
workers that name it (a deployment holds its worker process for as long as it serves). A message
is only a wake-up that names a job, a session or a deployment; the row in the database says what
to do. So a lost
message is published again by the reconciler, and a duplicate finds the job taken and does nothing.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue
from kombu.transport import redis as kombu_redis

from relay_api.settings import Settings

RUN_FINE_TUNE = "relay.run_fine_tune"
RUN_SESSION = "relay.run_session"
RUN_DEPLOYMENT = "relay.run_deployment"


def make_celery(settings: Settings, name: str = "relay") -> Celery:
    app = Celery(name, broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_ignore_result=True,
        task_routes={
            RUN_FINE_TUNE: {"queue": settings.fine_tune_queue},
            RUN_SESSION: {"queue": settings.session_queue},
            RUN_DEPLOYMENT: {"queue": settings.serving_queue},
        },
        task_default_queue=settings.fine_tune_queue,
        # A worker started without --queues takes both: recipe jobs and training sessions. The
        # serving queue is left out on purpose: a deployment would hold such a worker for good, so
        # only a worker that names it (--queues) takes deployments. Celery declares a queue named
        # that way as _queue does (an exchange of its own name, the name as the key).
        task_queues=[_queue(settings.fine_tune_queue), _queue(settings.session_queue)],
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=5,
        # Fail fast when the broker is down: the job row is already committed and the reconciler
        # publishes it later.
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
    )
    return app


def _queue(name: str) -> Queue:
    # Each queue its own exchange and key: without them Celery binds every queue to the default
    # queue's, and a message would reach both queues.
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


class _PublishingChannel(kombu_redis.Channel):
    """kombu's Redis channel builds a new Redis client, with its table of some 170 reply
    callbacks, for every message it sends: a third of a publish's CPU. This one builds one per
    channel and keeps it (a Redis client is thread-safe, and its connections stay pooled)."""

    _sending_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # consuming: as kombu does it
            return super()._create_client(asynchronous=True)
        if self._sending_client is None:
            self._sending_client = super()._create_client()
        return self._sending_client


class PublishingRedisTransport(kombu_redis.Transport):
    """kombu's Redis transport, with channels that keep their client: for a process that only
    publishes (the API)."""

    Channel = _PublishingChannel


class Publisher:
    """Hands jobs to the workers."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self.settings = settings
        if app is None:
            app = make_celery(settings, "relay-api")
            if settings.broker_url.startswith("redis://"):
                app.conf.broker_transport = f"{__name__}:{PublishingRedisTransport.__name__}"
        self.app = app

    def fine_tune(self, job_id: str) -> None:
        self.app.send_task(RUN_FINE_TUNE, args=[job_id], queue=self.settings.fine_tune_queue)

    def session(self, session_id: str) -> None:
        self.app.send_task(RUN_SESSION, args=[session_id], queue=self.settings.session_queue)

    def deployment(self, deployment_id: str) -> None:
        self.app.send_task(RUN_DEPLOYMENT, args=[deployment_id], queue=self.settings.serving_queue)
