"""The service's settings, from ``RELAY_*`` environment variables (or a .env file), checked at start.

The API, the workers, the migrations and the embedded server read the same class; with nothing
set, everything lives in the data directory (``RELAY_HOME``, else ``~/.relay``; an empty value
counts as unset): SQLite for the database and for the Celery broker, so a laptop needs no servers.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from relay import client_config
from relay.sft.config import CHECKPOINT_EVERY_DEFAULT


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RELAY_", env_file=".env", extra="ignore")

    # The data directory: job work dirs (checkpoints, output) and, by default, the SQLite files.
    home: Path = Field(default_factory=client_config.data_dir)
    # SQLAlchemy URL; postgresql:// is read as postgresql+psycopg://. Default: SQLite in `home`.
    database_url: str = ""
    # Celery broker URL, such as redis://redis:6379/0. Default: SQLite in `home` (no server needed).
    broker_url: str = ""
    # Where the engine caches datasets it downloads (None: the engine's default, RELAY_CACHE_DIR).
    dataset_cache_dir: Path | None = None

    # Whether a job may name a directory on the workers' disks as its dataset (an absolute path,
    # ~/..., ./... or file://). Right for a laptop; off for a shared service (docker-compose.yml).
    local_datasets: bool = True
    # Whether the API sees the disk its workers read datasets from (the embedded server does; so
    # does a service whose API mounts the workers' volumes). Then a job naming a local dataset
    # directory that is not there is refused when it is created, not failed by its worker.
    api_shares_workers_disk: bool = False
    # Whether workers without GPUs may take a job of a model sized for GPUs (pi05, 3.35 B weights:
    # relay.families.is_gpu_sized). Off, the API refuses one while every live worker is such.
    allow_cpu_full_size: bool = False
    # Whether every worker of this service trains on its CPU, known before any worker's heartbeat:
    # `relay server` sets it on a machine without an NVIDIA GPU, so a pi05 job created in its first
    # seconds is refused like one created later (not taken by its CPU worker and failed there).
    cpu_workers_only: bool = False

    fine_tune_queue: str = "relay.fine-tunes"
    # Steps between a job's checkpoints: what a lost worker can cost at most.
    checkpoint_every: int = Field(CHECKPOINT_EVERY_DEFAULT, ge=1)
    # A claimed job's lease; its worker renews it every `heartbeat_seconds`. A job whose lease
    # lapses is resumed by another attempt.
    lease_seconds: float = Field(60.0, gt=0)
    heartbeat_seconds: float = Field(0.0, ge=0)  # 0: a quarter of the lease
    # How often each worker's reconciler looks for lapsed leases and jobs that never reached the broker.
    reconcile_seconds: float = Field(15.0, gt=0)
    # A queued job whose message may have been lost (Redis restart) is published again after this long.
    republish_seconds: float = Field(600.0, gt=0)
    # Claims of one job before it ends in `error`.
    max_attempts: int = Field(3, ge=1)
    # GPUs for a worker's processes, one each: "0,1,2,3" with `python -m relay_worker -c 4`. Empty: as is.
    worker_gpus: str = ""
    # GPUs this worker gives one recipe job, started as that many processes through
    # torch.distributed.run (on a host without CUDA, processes on its CPU, over gloo). Such a worker
    # runs with `-c 1` and sees all those GPUs (RELAY_WORKER_GPUS empty). Workers report it in their
    # heartbeats; the API refuses a job that asks for more than all live workers have together.
    worker_slots: int = Field(1, ge=1)
    # A job of more GPUs than one worker has runs on several workers at once (a gang): the workers
    # that took it wait this long for the rest to arrive, then give themselves back (the job stays
    # queued). It is also how long the launcher's rendezvous waits for every host.
    gang_wait_seconds: float = Field(300.0, gt=0)
    # The address other workers reach this one's host at, for a gang's rendezvous (the launcher's
    # c10d store and the processes' own connections). Empty: the host's fully qualified name.
    worker_address: str = ""
    # Memory of each of those GPUs, in GB, as workers report it in their heartbeats; 0: read it
    # from nvidia-smi (none on a host without NVIDIA GPUs). The API refuses a job whose memory
    # plan fits no live worker's GPUs.
    worker_gpu_memory_gb: float = Field(0.0, ge=0)

    # Training-loop sessions: their own queue on the same workers, one session per worker process.
    session_queue: str = "relay.sessions"
    # A session without contact from its client (calls, heartbeats) for this long is closed.
    session_idle_seconds: float = Field(600.0, gt=0)
    # A session that no worker took (or that never finished loading) within this long is ended;
    # the client gives up sooner, after its own start_timeout.
    session_start_seconds: float = Field(1800.0, gt=0)
    # How long a call's result is kept for its client to read.
    session_result_seconds: float = Field(3600.0, gt=0)
    # Calls sent and not yet run, per session, before the API answers 429 (the SDK keeps 8 ahead).
    session_max_pending_calls: int = Field(64, ge=1)
    # The largest body of a JSON request (a recipe, a session's settings); bigger ones get a 413
    # before they are read. A session's calls have their own limit, below.
    max_json_body_bytes: int = Field(1 << 20, ge=1 << 10)
    # The largest call body (a batch with its frames): the largest honest request.
    session_max_call_bytes: int = Field(1 << 30, ge=1 << 20)
    # How calls and results travel between the API and the worker holding a session: through Redis
    # (streams and keys), or through the SQL database (polled; the embedded server, which has no Redis).
    # "auto": Redis when the broker is Redis, else SQL.
    session_channel: Literal["auto", "redis", "sql"] = "auto"
    # Redis for the session channel; by default the broker's when that is Redis.
    redis_url: str = ""

    # Deployments (docs/serving.md): their own queue, taken only by workers that name it
    # (`python -m relay_worker --queues relay.serving`), one deployment per worker process.
    serving_queue: str = "relay.serving"
    # The address a serving worker's policy servers listen on; 0.0.0.0 where the API runs on
    # another host (docker-compose.yml). Each deployment gets a free port and its own secret.
    serving_host: str = "127.0.0.1"
    # The host the API reaches those servers at. Empty: `serving_host`, or, when that is a
    # wildcard address, `worker_address` (else the host's fully qualified name).
    serving_advertised_host: str = ""
    # How long the API waits to connect to a deployment's worker before answering 503: short, so a
    # robot whose deployment's worker died is told to retry instead of hanging.
    serving_connect_timeout_seconds: float = Field(2.0, gt=0)
    # How long the API waits for a deployment's answer (a batch of actions) once connected.
    serving_request_timeout_seconds: float = Field(60.0, gt=0)
    # The largest /actions body (observations with their images, base64) and websocket message.
    serving_max_body_bytes: int = Field(16 << 20, ge=1 << 10)
    # The API's address as robots reach it (https://relay.example.com behind a TLS proxy), for a
    # deployment's websocket_url and actions_url. Empty: the address each request came to.
    public_url: str = ""

    # Webhooks (docs/api.md, "Webhooks"): sent by each worker's reconciler thread on a pool of its own.
    # Seconds before each retry of a delivery, comma-separated; the last repeats (hourly) until the
    # delivery is given up: after `webhook_max_attempts` attempts, or `webhook_give_up_seconds`
    # after the event.
    webhook_retry_seconds: str = "5,30,120,600,3600"
    webhook_max_attempts: int = Field(80, ge=1)
    webhook_give_up_seconds: float = Field(72 * 3600.0, gt=0)
    # One attempt's limit (connect, send, the answer's headers): a slow receiver costs one thread
    # of the pool this long, never the reconciler or a job.
    webhook_timeout_seconds: float = Field(5.0, gt=0, le=60)
    # Attempts under way at once per worker process.
    webhook_senders: int = Field(4, ge=1, le=64)
    # Webhooks a user may have.
    webhooks_per_user: int = Field(20, ge=1)
    # Whether webhooks may go to loopback, private, link-local and other non-public addresses: off,
    # so that a user's URL cannot reach into the deployment's own network (relay_api.
    # webhook_addresses); `relay server` turns it on, as a laptop's receivers are its own.
    webhook_private_addresses: bool = False

    # How often a live event stream looks for new events.
    events_poll_seconds: float = Field(0.5, gt=0)
    # How long the API remembers a key it has checked; a revocation anywhere ends that within a
    # second (relay_api.keys.REVOCATION_CHECK_SECONDS).
    auth_cache_seconds: float = Field(30.0, ge=0)
    # Database connections per process (the API's thread pool runs 40 requests at once at most).
    db_pool_size: int = Field(20, ge=1)
    # Serve /metrics (Prometheus): off by default on a shared server, since it tells anyone who can
    # reach it how busy the service is; the embedded server turns it on.
    metrics: bool = False
    # Move the objects alive once the API has started (its modules, the app) out of the cyclic
    # garbage collector's generations (gc.freeze), so that a full collection during a request
    # walks only what requests made, not the whole process: see docs/service.md.
    gc_freeze: bool = True

    @field_validator("home", mode="before")
    @classmethod
    def _empty_home_is_unset(cls, value: object) -> object:
        # RELAY_HOME="" would otherwise be the working directory, and scatter relay.db there.
        return client_config.data_dir() if value in ("", None) else value

    @field_validator("webhook_retry_seconds")
    @classmethod
    def _retry_schedule(cls, value: str) -> str:
        try:
            delays = [float(part) for part in value.split(",") if part.strip()]
        except ValueError:
            delays = []
        if not delays or any(not 0 < delay < 1e7 for delay in delays):
            raise ValueError("must be seconds before each retry, comma-separated numbers above 0: 5,30,120")
        return value

    @property
    def webhook_retry_schedule(self) -> tuple[float, ...]:
        return tuple(float(part) for part in self.webhook_retry_seconds.split(",") if part.strip())

    @model_validator(mode="after")
    def _defaults_in_home(self) -> Settings:
        self.home = self.home.expanduser().absolute()
        if not self.database_url:
            self.database_url = f"sqlite:///{self.home / 'relay.db'}"
        if not self.broker_url:
            self.broker_url = f"sqla+sqlite:///{self.home / 'broker.db'}"
        if self.database_url.startswith(("postgresql://", "postgres://")):
            self.database_url = "postgresql+psycopg://" + self.database_url.split("://", 1)[1]
        if not self.heartbeat_seconds:
            self.heartbeat_seconds = self.lease_seconds / 4
        if not self.redis_url and self.broker_url.startswith(("redis://", "rediss://")):
            self.redis_url = self.broker_url
        if self.session_channel == "auto":
            self.session_channel = "redis" if self.redis_url else "sql"
        if self.session_channel == "redis" and not self.redis_url:
            raise ValueError("session_channel is redis, but no redis_url is set (nor a Redis broker_url)")
        return self

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def user_dir(self, user_id: int) -> Path:
        """A user's files (saved states, sessions' saved weights), by user id: names may hold dots."""
        return self.home / "users" / str(user_id)

    @property
    def uses_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


@functools.cache
def get_settings() -> Settings:
    """The settings of this process, read once."""
    return Settings()
