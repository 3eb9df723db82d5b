"""The tables. The fine-tune row is the truth about a job; the queue only wakes a worker up."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from relay_api.db import Base, UTCDateTime, utcnow

# BIGINT on PostgreSQL, but INTEGER on SQLite, where only INTEGER PRIMARY KEY autoincrements.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiKey(Base):
    """An API key, stored as its sha256 (keys are long random strings, so a plain hash suffices)."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The key's first characters, to tell keys apart in listings.
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class FineTune(Base):
    """A recipe job: its config, its status, its progress, and who may write to it (the claim)."""

    __tablename__ = "fine_tunes"
    __table_args__ = (
        UniqueConstraint("user_id", "idempotency_key", name="uq_fine_tunes_user_idempotency_key"),
        Index("ix_fine_tunes_user_created", "user_id", "created_at", "id"),
        Index("ix_fine_tunes_status", "status"),
        # The jobs of a user that ended since a time: what the webhook dispatcher looks for.
        Index("ix_fine_tunes_user_finished", "user_id", "finished_at"),
    )

    id: Mapped[str] = mapped_column(String(16), primary_key=True)  # "ft-" + 12 hex
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # SFTConfig.model_dump()
    status: Mapped[str] = mapped_column(String(20))
    step: Mapped[int] = mapped_column(Integer, default=0)
    loss: Mapped[float | None] = mapped_column()
    error: Mapped[str | None] = mapped_column(Text)
    output_dir: Mapped[str | None] = mapped_column(Text)
    # Output files with their sizes and sha256, recorded when the job completes.
    files: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # What the engine read, from its dataset event: repo or path, revision, sha, format, frames, episodes.
    dataset: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Where its starting weights came from (from_checkpoint), from its weights event: the model and the
    # repo, revision and sha, or the directory, or the fine-tune.
    weights: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    # The claim: each claim increments `attempt`, the fencing token that every write of a worker
    # must match; the lease says until when the claiming worker is presumed alive.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Claims given back on purpose (a worker shutting down), which do not count against max_attempts.
    handovers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # When the last lease lapsed, kept once the reconciler has handed the job on (which clears
    # `lease_until`) until a worker claims it: how long a job no worker runs has waited.
    lease_lapsed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    # Why the last attempt ended without finishing the job; the final error quotes it.
    last_failure: Mapped[str | None] = mapped_column(Text)
    # When the job was last handed to the broker (None: not yet; the reconciler will).
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))

    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    cancel_requested_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class FineTuneEvent(Base):
    """One event of a job: the engine's metrics every few steps, checkpoints, the end.

    (job, step, kind) is unique, so a step that a resumed attempt runs again adds nothing twice.
    """

    __tablename__ = "fine_tune_events"
    __table_args__ = (
        UniqueConstraint("job_id", "step", "kind", name="uq_fine_tune_events_job_step_kind"),
        Index("ix_fine_tune_events_job_id_id", "job_id", "id"),  # a job's events after a cursor
        # A job's few events of some kinds (the results card's checkpoints, validation, eval), and
        # the metrics window at or before a step, without reading its many metrics events.
        Index("ix_fine_tune_events_job_kind_step", "job_id", "kind", "step"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tunes.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    # "metrics" for the engine's periodic reports, else the event's name ("checkpoint", "finished", ...).
    kind: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class FineTuneCard(Base):
    """What a job's results card folds from its metrics and resumed events (relay_api.job_cards):
    kept up to date as each of those events is written (relay_api.event_rows), so that the card
    reads this row and the job's few other events rather than every metrics event. `state` is
    NULL only inside the transaction that creates the row and folds the job's earlier events."""

    __tablename__ = "fine_tune_cards"

    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tunes.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class TrainingSessionRow(Base):
    """A training-loop session: what it trains, where it runs, and how it ended.

    starting (queued, then loading on the worker named in `worker`) -> ready -> closed | error.
    The worker renews `lease_until` while it holds the session; a lapsed lease means it is gone.
    """

    __tablename__ = "training_sessions"
    __table_args__ = (
        UniqueConstraint("user_id", "idempotency_key", name="uq_training_sessions_user_idempotency_key"),
        Index("ix_training_sessions_user_created", "user_id", "created_at", "id"),
        Index("ix_training_sessions_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(16), primary_key=True)  # "ses-" + 12 hex
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # relay.training.config.SessionConfig
    info: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the model's sizes, once loaded
    error: Mapped[str | None] = mapped_column(Text)  # why it ended in error, or why it was closed
    worker: Mapped[str | None] = mapped_column(String(255))
    lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_contact_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    close_requested_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    ready_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # What the session did, as its worker last reported (with each lease renewal, and at the end).
    calls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    steps: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    saved_states: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class SessionMessage(Base):
    """A session's call or result in the SQL channel (the embedded server, which has no Redis)."""

    __tablename__ = "session_messages"
    __table_args__ = (PrimaryKeyConstraint("session_id", "kind", "seq", name="pk_session_messages"),)

    session_id: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(8))  # "call" or "result"
    seq: Mapped[int] = mapped_column(BigInteger)
    request_id: Mapped[str | None] = mapped_column(String(64))
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class WorkerHeartbeat(Base):
    """A worker's sign of life, written by its reconciler every pass (/metrics counts the recent ones)."""

    __tablename__ = "worker_heartbeats"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)  # host:pid of the main process
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The GPUs (or, on a CPU host, process slots) this worker gives one recipe job.
    gpus: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # Bytes of memory of the smallest of those GPUs; None on a host without GPUs (CPU slots).
    gpu_memory: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The video codecs its decoder library reads, a JSON list of names (h264, hevc, av1...); None
    # from a worker that does not say.
    video_decoders: Mapped[str | None] = mapped_column(Text, nullable=True)
    # What it consumes: the recipe jobs' queue (and sessions'), the serving queue, or both. Jobs are
    # placed on the first kind (relay_api.workers.live_workers), deployments on the second.
    takes_jobs: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    serves_deployments: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class FineTuneHost(Base):
    """A worker host's seat in the gang of a job that spans several hosts (more `gpus` than one has).

    Seats are taken while the job waits in the queue; the job starts (as attempt `round`) when the
    seats' processes add up to its `gpus`, and the seats are given back (deleted) if they do not in
    time. Seat 0 serves the launcher's c10d rendezvous at `endpoint`.
    """

    __tablename__ = "fine_tune_hosts"
    __table_args__ = (PrimaryKeyConstraint("job_id", "round", "seat"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tunes.id", ondelete="CASCADE"))
    round: Mapped[int] = mapped_column(Integer)  # the attempt the gang runs as once complete
    seat: Mapped[int] = mapped_column(Integer)  # 0, 1, ...: the order the hosts arrived in
    worker: Mapped[str] = mapped_column(String(255))  # host:pid of the worker process
    processes: Mapped[int] = mapped_column(Integer)  # the job's processes (GPUs) on this host
    endpoint: Mapped[str] = mapped_column(String(255))  # host:port of the gang's rendezvous
    joined_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class DatasetCredential(Base):
    """A job's database URL as given, its password in it, kept apart from the job: the job's row, its
    config and its events hold the URL with the password masked (`postgresql://ana:***@db/shop`). The
    worker reads it once, to take the job's snapshot of the database, and deletes it; every later
    attempt reads that snapshot, so the password is held only between the job's creation and its start."""

    __tablename__ = "dataset_credentials"

    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tunes.id", ondelete="CASCADE"), primary_key=True)
    url: Mapped[str] = mapped_column(Text)  # the URL as given, its password in it
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class TrackerCredential(Base):
    """The keys given with a job's integrations (a W&B API key, an MLflow token), by the environment
    variable each stands for, kept apart from the job: its row, config, events and answers never
    hold them. Each attempt's worker reads them for the job's trackers; they are deleted once the
    job has ended (relay_api.tracker_credentials)."""

    __tablename__ = "tracker_credentials"

    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tunes.id", ondelete="CASCADE"), primary_key=True)
    secrets: Mapped[dict[str, str]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class DeploymentRow(Base):
    """A deployment: a model served to robots by a worker that holds it (docs/serving.md).

    starting (queued, then loading on the worker named in `worker`) -> ready -> stopped | error;
    a lost worker puts it back to starting, and another worker loads it again as the next attempt.
    """

    __tablename__ = "deployments"
    __table_args__ = (
        UniqueConstraint("user_id", "idempotency_key", name="uq_deployments_user_idempotency_key"),
        Index("ix_deployments_user_created", "user_id", "created_at", "id"),
        Index("ix_deployments_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(16), primary_key=True)  # "dep-" + 12 hex
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # relay.serving.config.DeploymentConfig
    # What the worker loads: a job's output directory, a session's saved weights, or a base model's
    # name; resolved by the API when the deployment is created.
    model_source: Mapped[str] = mapped_column(Text)
    # The policy server's metadata (cameras, state and action sizes...), once loaded.
    info: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)  # why it ended in error, or why it stopped

    # The claim, as for jobs: each claim increments `attempt`, the fencing token every write of the
    # worker must match; the lease says until when that worker is presumed alive.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Attempts in a row whose worker was lost before the model was loaded; max_attempts of them end it.
    failed_starts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # Where the API reaches the worker's policy server (http://HOST:PORT), while ready.
    internal_url: Mapped[str | None] = mapped_column(Text)
    # The secret the API shows the policy server; per deployment, never shown to users.
    internal_token: Mapped[str] = mapped_column(String(64))
    # The policy server's figures, written by its worker with each lease renewal.
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    stop_requested_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    ready_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class DeploymentEvent(Base):
    """One move of a deployment between statuses (relay.serving.status.EVENT_KINDS), with why."""

    __tablename__ = "deployment_events"
    __table_args__ = (Index("ix_deployment_events_deployment_id_id", "deployment_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookRow(Base):
    """A user's webhook: where to POST which events (relay.webhooks.EVENT_TYPES), and the secret
    that signs them. The secret is kept as given, since signing needs it; the API shows it once."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_user_created", "user_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "wh_" + 24 hex
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookDelivery(Base):
    """One event for one webhook, and how sending it went (relay_worker.webhook_dispatch).

    Written by the workers' dispatcher for each job that ended, and each evaluation a job finished,
    after the webhook was created; (webhook, job, type, step) is unique, so two workers' passes write
    it once. `next_attempt_at` is when
    it is due; a worker claims it by moving that forward (a conditional UPDATE), so no two send it
    at once, and a worker lost while sending leaves it due again once that claim has passed."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint(
            "webhook_id", "job_id", "type", "step", name="uq_webhook_deliveries_webhook_job_type_step"
        ),
        Index("ix_webhook_deliveries_webhook_created", "webhook_id", "created_at", "id"),
        Index("ix_webhook_deliveries_status_due", "status", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # the event's id: "evt_" + 24 hex
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tunes.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(32))
    # The step of the evaluation a fine_tune.evaluated event is of (a job has one at each checkpoint);
    # -1 for a job's end, of which there is one.
    step: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    # The body as first written, sent byte for byte on every attempt.
    payload: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))  # pending, delivered, failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_response_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


users = cast(Table, User.__table__)
api_keys = cast(Table, ApiKey.__table__)
fine_tunes = cast(Table, FineTune.__table__)
fine_tune_events = cast(Table, FineTuneEvent.__table__)
fine_tune_cards = cast(Table, FineTuneCard.__table__)
training_sessions = cast(Table, TrainingSessionRow.__table__)
session_messages = cast(Table, SessionMessage.__table__)
worker_heartbeats = cast(Table, WorkerHeartbeat.__table__)
fine_tune_hosts = cast(Table, FineTuneHost.__table__)
deployments = cast(Table, DeploymentRow.__table__)
deployment_events = cast(Table, DeploymentEvent.__table__)
dataset_credentials = cast(Table, DatasetCredential.__table__)
tracker_credentials = cast(Table, TrackerCredential.__table__)
webhooks = cast(Table, WebhookRow.__table__)
webhook_deliveries = cast(Table, WebhookDelivery.__table__)
