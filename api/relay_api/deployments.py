"""What the API does with deployments' rows: create (idempotently, once the model is known to be
servable), find, list, stop, and their events. The worker's side is relay_worker.serving_lifecycle.

The row is the truth about a deployment. starting -> ready -> stopped | error, through conditional
updates; the one move back, ready -> starting, is the reconciler's, when the worker holding the
deployment is lost and another must load it (a new attempt: fencing, as for jobs).
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from relay import families
from relay.serving import status as st
from relay.serving.config import SERVED_BASE_MODELS, DeploymentConfig, model_kind, session_weights
from relay.sft import status as job_status
from relay_api import fine_tunes, sessions
from relay_api.db import Db, iso, rows_changed, utcnow
from relay_api.errors import APIProblem
from relay_api.idempotency import insert_once, request_hash
from relay_api.models import deployment_events as events_table
from relay_api.models import deployments as table
from relay_api.pagination import newest_first
from relay_api.schemas import DeploymentOut
from relay_api.settings import Settings
from relay_api.workers import serving_workers

DEPLOYMENT_ID_PREFIX = "dep-"
STOPPED_BY_USER = "stopped by its owner"
STOPPED_BEFORE_READY = "stopped by its owner before it was ready"


def new_deployment_id() -> str:
    return DEPLOYMENT_ID_PREFIX + secrets.token_hex(6)


def websocket_url(api_base_url: str, deployment_id: str) -> str:
    """The deployment's websocket on the API, for openpi-client: ws:// (wss:// behind https)."""
    base = api_base_url.rstrip("/")
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/v1/deployments/{deployment_id}/ws"


def deployment_object(row: Mapping[str, Any], api_base_url: str) -> dict[str, Any]:
    """A deployment as the API shows it (schemas.DeploymentOut, the one definition of its shape).
    The worker's address and the deployment's secret are never shown."""
    config = row["config"]
    shown = {
        "id": row["id"],
        "object": "deployment",
        "status": row["status"],
        "model": config["model"],
        "gpus": config["gpus"],
        "max_batch": config["max_batch"],
        "max_wait_ms": config["max_wait_ms"],
        "idle_timeout_seconds": config["idle_timeout_seconds"],
        "websocket_url": websocket_url(api_base_url, row["id"]),
        "actions_url": f"{api_base_url.rstrip('/')}/v1/deployments/{row['id']}/actions",
        # Named as the deployment names its model (a worker's metadata once named the path it loaded).
        "info": {**row["info"], "model": config["model"]} if row["info"] else row["info"],
        "stats": row["stats"],
        "error": row["error"],
        "attempt": row["attempt"],
        "created_at": iso(row["created_at"]),
        "ready_at": iso(row["ready_at"]),
        "ended_at": iso(row["ended_at"]),
    }
    return DeploymentOut.model_validate(shown).model_dump(mode="json")


def not_found(deployment_id: str) -> APIProblem:
    return APIProblem(404, f"no deployment {deployment_id}", param="id", code="not_found")


def model_source(db: Db, user_id: int, config: DeploymentConfig, settings: Settings) -> str:
    """What a worker loads for `config.model` (a job's output directory, a session's saved weights'
    directory, or the base model's name), after checking that it exists, is the caller's and can be
    served; an APIProblem naming `model` otherwise. Another user's job or session is as absent as
    one that never existed."""
    model = config.model
    kind = model_kind(model)
    if kind == "job":
        try:
            job = fine_tunes.get(db, user_id, model)
        except APIProblem:
            raise _no_model(f"no fine-tune {model}") from None
        if job["status"] != job_status.COMPLETED or not job["output_dir"]:
            raise APIProblem(
                400,
                f"bad model: fine-tune {model} is {job['status']} (only a completed fine-tune's "
                "weights can be deployed)",
                param="model",
                code="model_not_ready",
            )
        _check_served(db, job["config"]["model"], settings, tuned=True)
        return str(job["output_dir"])
    if kind == "session_weights":
        session_id, name = session_weights(model)
        try:
            session = sessions.get(db, user_id, session_id)
        except APIProblem:
            raise _no_model(f"no training session {session_id}") from None
        directory = saved_weights_dir(settings, user_id, session_id, name)
        if not (directory / "config.json").is_file():
            raise _no_model(
                f"session {session_id} saved no weights named {name!r} (save_weights_for_sampler)"
            )
        base_model = session["config"]["base_model"]
        family = families.family_of(base_model)
        _check_served(db, base_model, settings, tuned=family is not None and family.serves_session_weights)
        return str(directory)
    _check_served(db, model, settings)
    return model


def _no_model(what: str) -> APIProblem:
    return APIProblem(404, f"bad model: {what}", param="model", code="not_found")


def _check_served(db: Db, base_model: str, settings: Settings, *, tuned: bool = False) -> None:
    """A model of a family deployments serve, and one some live serving worker can hold: a model
    sized for GPUs is refused while every live worker that takes deployments runs on its CPU (the
    rule of sessions and jobs, asked of the workers that would hold it; with none alive nothing is
    known, and it waits). An RT-J is served from a tuned job only: its output names the task and
    database it predicts."""
    family = families.family_of(base_model)
    served_when_tuned = tuned and family is not None and family.deployments == "tuned_only"
    if base_model not in SERVED_BASE_MODELS and not served_when_tuned:
        tuned_only = ", ".join(families.models_where(lambda spec: spec.deployments == "tuned_only"))
        raise APIProblem(
            400,
            f"bad model: a {base_model} model cannot be deployed (deployments serve "
            f"{', '.join(SERVED_BASE_MODELS)} policies, and {tuned_only} models tuned by a "
            "fine-tune, whose output names what they are for)",
            param="model",
            code="invalid_value",
        )
    if settings.allow_cpu_full_size or not families.is_gpu_sized(base_model):
        return
    if settings.cpu_workers_only:
        raise fine_tunes.too_big_for_cpus(base_model, "model", known_before_beats=True)
    workers = serving_workers(db, settings.reconcile_seconds)
    if workers and all(w.gpu_memory is None for w in workers):
        raise fine_tunes.too_big_for_cpus(base_model, "model")


def create(
    db: Session, user_id: int, config: DeploymentConfig, source: str, idempotency_key: str | None
) -> tuple[dict[str, Any], bool]:
    """Insert a starting deployment and commit; returns (row, replayed). The same Idempotency-Key
    with the same config returns the deployment it created before; with a different one, 409."""
    digest = request_hash(config)

    def new_row() -> dict[str, Any]:
        now = utcnow()
        return {
            "id": new_deployment_id(),
            "user_id": user_id,
            "status": st.STARTING,
            "config": config.model_dump(mode="json"),
            "model_source": source,
            "info": None,
            "error": None,
            "attempt": 0,
            "failed_starts": 0,
            "worker": None,
            "lease_until": None,
            "internal_url": None,
            "internal_token": secrets.token_urlsafe(32),
            "stats": None,
            "stop_requested_at": None,
            "idempotency_key": idempotency_key,
            "request_hash": digest,
            "created_at": now,
            "updated_at": now,
            "ready_at": None,
            "ended_at": None,
        }

    def shown(row: dict[str, Any]) -> dict[str, Any]:
        return deployment_object(row, "http://relay.invalid")  # the address does not change the rendering

    row, replayed, _ = insert_once(db, table, user_id, idempotency_key, digest, new_row, "deployment", shown)
    if not replayed:
        record_event(
            db, row["id"], st.STARTING, 0, "created; waiting for a serving worker", row["created_at"]
        )
        db.commit()
    return row, replayed


def record_event(
    db: Session, deployment_id: str, kind: str, attempt: int, reason: str | None, now: dt.datetime
) -> None:
    """The one writer of deployment events (the API, the worker and the reconciler call it inside
    the transaction of the move it records)."""
    assert kind in st.EVENT_KINDS
    db.execute(
        insert(events_table).values(
            deployment_id=deployment_id, kind=kind, attempt=attempt, reason=reason, created_at=now
        )
    )


def get(db: Db, user_id: int, deployment_id: str) -> dict[str, Any]:
    """The caller's deployment; another user's is as absent as one that never existed."""
    row = (
        db.execute(select(table).where(table.c.id == deployment_id, table.c.user_id == user_id))
        .mappings()
        .first()
    )
    db.rollback()  # end the read here, in the route's thread
    if row is None:
        raise not_found(deployment_id)
    return dict(row)


def list_page(db: Db, user_id: int, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The caller's deployments, newest first, starting after the deployment `after`."""
    return newest_first(db, table, user_id, after, limit, "deployments")


def event_object(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "deployment.event",
        "event": row["kind"],
        "reason": row["reason"],
        "attempt": row["attempt"],
        "created_at": iso(row["created_at"]),
    }


def events_page(
    db: Db, user_id: int, deployment_id: str, after: int | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """The caller's deployment's events after event id `after`, oldest first; and whether more follow."""
    get(db, user_id, deployment_id)  # 404 unless the caller's
    query = select(events_table).where(events_table.c.deployment_id == deployment_id)
    if after is not None:
        query = query.where(events_table.c.id > after)
    rows = db.execute(query.order_by(events_table.c.id).limit(limit + 1)).mappings().all()
    db.rollback()
    return [event_object(dict(r)) for r in rows[:limit]], len(rows) > limit


def request_stop(db: Session, user_id: int, deployment_id: str) -> dict[str, Any]:
    """Stop: a deployment no worker holds (waiting in the queue, or its worker lost) stops now; one a
    worker holds stops when that worker next renews its lease (within `heartbeat_seconds`). Stopping
    again is harmless. Returns the row as it is now."""
    row = get(db, user_id, deployment_id)
    if row["status"] in st.ENDED:
        return row
    now = utcnow()
    unheld = (table.c.lease_until.is_(None)) | (table.c.lease_until < now)
    reason = STOPPED_BEFORE_READY if row["status"] == st.STARTING else STOPPED_BY_USER
    moved = rows_changed(
        db.execute(
            update(table)
            .where(table.c.id == deployment_id, table.c.status.in_(st.LIVE), unheld)
            .values(
                status=st.STOPPED,
                error=reason,
                stop_requested_at=now,
                ended_at=now,
                updated_at=now,
                lease_until=None,
                internal_url=None,
            )
        )
    )
    if moved:
        record_event(db, deployment_id, st.STOPPED, row["attempt"], reason, now)
    else:
        db.execute(
            update(table)
            .where(
                table.c.id == deployment_id, table.c.status.in_(st.LIVE), table.c.stop_requested_at.is_(None)
            )
            .values(stop_requested_at=now, updated_at=now)
        )
    db.commit()
    return get(db, user_id, deployment_id)


def end_unpublished(db: Session, deployment_id: str, reason: str) -> None:
    """The queue could not be reached: end the deployment now rather than leave it starting."""
    now = utcnow()
    moved = rows_changed(
        db.execute(
            update(table)
            .where(table.c.id == deployment_id, table.c.status == st.STARTING)
            .values(status=st.ERROR, error=reason, ended_at=now, updated_at=now)
        )
    )
    if moved:
        record_event(db, deployment_id, st.ERROR, 0, reason, now)
    db.commit()


def saved_weights_dir(settings: Settings, user_id: int, session_id: str, name: str) -> Path:
    """Where a session's worker wrote `save_weights_for_sampler(name)` (relay_worker.session)."""
    return settings.user_dir(user_id) / "sessions" / session_id / "weights" / name
