"""/v1/fine-tunes: create, list, retrieve, cancel, events (pages or a live stream), files."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.responses import FileResponse, Response
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from relay.sft import status as st
from relay.sft.config import SFTConfig
from relay_api import event_rows, fine_tunes, job_summary, schemas
from relay_api.db import utcnow
from relay_api.deps import (
    CurrentUser,
    DbDep,
    SettingsDep,
    read_db,
)
from relay_api.enqueued import EnqueuedNotes
from relay_api.files import listing, pin, resolve, unpin
from relay_api.models import fine_tune_events
from relay_api.models import fine_tunes as fine_tunes_table
from relay_api.params import EventAfter, IdempotencyKey, JobId, PageAfter, PageLimit, event_id_from_header
from relay_api.queue import Publisher
from relay_api.responses import JSONResponse
from relay_api.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/fine-tunes", tags=["fine-tunes"], responses=schemas.ERRORS)


@router.post(
    "",
    summary="Start a fine-tune",
    responses={200: {"model": schemas.FineTuneOut}, **schemas.IDEMPOTENCY_CONFLICT},
)
def create_fine_tune(
    config: Annotated[SFTConfig, Body()],
    user: CurrentUser,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Accept a recipe and answer at once with the job (`queued`); a worker picks it up."""
    # The settings, the publisher and the notes straight from app.state (what SettingsDep,
    # PublisherDep and EnqueuedNotesDep read): the busiest write route skips solving three
    # dependencies on every request.
    state = request.app.state
    settings: Settings = state.settings
    publisher: Publisher = state.publisher
    notes: EnqueuedNotes = state.enqueued
    fine_tunes.check_datasets(config, settings)
    fine_tunes.check_mixture(config, settings)
    fine_tunes.check_tasks_dir(config.tasks_dir, settings)
    fine_tunes.check_eval_budget(config, settings)
    with read_db(request) as db:  # the INSERT is one statement, atomic by itself
        fine_tunes.check_checkpoint(db, user, config.model, config.from_checkpoint, settings)
        config = fine_tunes.place_on_workers(db, config, settings, cpu_full_size=settings.allow_cpu_full_size)
        row, replayed, answer = fine_tunes.create_shown(db, user, config, idempotency_key)
    if not replayed:
        try:
            publisher.fine_tune(row["id"])
            notes.note(row["id"])
        except Exception:  # the row is the truth: the reconciler publishes it later
            log.warning("could not publish %s now; the reconciler will", row["id"], exc_info=True)
    headers = {"idempotent-replayed": "true"} if replayed else None
    return JSONResponse(answer, headers=headers)


@router.get(
    "",
    summary="List your fine-tunes, newest first",
    responses={200: {"model": schemas.FineTuneList}, **schemas.NOT_FOUND},
)
def list_fine_tunes(
    user: CurrentUser,
    request: Request,
    after: PageAfter = None,
    limit: PageLimit = 20,
) -> Response:
    with read_db(request) as db:
        rows, has_more = fine_tunes.list_page(db, user, after, limit)
        validation = fine_tunes.validation_blocks(db, rows)
    data = [fine_tunes.job_object(r, validation.get(r["id"])) for r in rows]
    return JSONResponse({"object": "list", "data": data, "has_more": has_more})


@router.get(
    "/{job_id}",
    summary="Retrieve a fine-tune",
    responses={200: {"model": schemas.FineTuneOut}, **schemas.NOT_FOUND},
)
def retrieve_fine_tune(job_id: JobId, user: CurrentUser, request: Request) -> Response:
    with read_db(request) as db:
        job = fine_tunes.get(db, user, job_id, shown_only=True)
        validation = fine_tunes.validation_blocks(db, [job])
    return JSONResponse(fine_tunes.job_object(job, validation.get(job_id)))


@router.get(
    "/{job_id}/summary",
    summary="A fine-tune's results card",
    responses={200: {"model": schemas.FineTuneSummary}, **schemas.NOT_FOUND},
)
def fine_tune_summary(job_id: JobId, user: CurrentUser, request: Request, settings: SettingsDep) -> Response:
    """Figures computed from the job and its events: duration, elapsed and ETA while running, pace
    (steps and samples per second), first, last and best training loss, each checkpoint with the
    figures at its step (and whether its files are kept), validation and closed-loop results once
    reported, and how to use the model (commands with the job's id). The console's job page, the
    SDK's `FineTuneJob.summary()` and `relay fine-tunes retrieve` show this answer."""
    with read_db(request) as db:
        fill = partial(event_rows.fill_card, request.app.state.db_sessions)
        card = job_summary.job_summary(db, user, job_id, settings.job_dir(job_id), utcnow(), fill)
    return JSONResponse(card)


@router.post(
    "/{job_id}/cancel",
    summary="Cancel a fine-tune",
    responses={
        200: {"model": schemas.FineTuneOut},
        409: {"model": schemas.ErrorOut, "description": "The job already completed or failed."},
        **schemas.NOT_FOUND,
    },
)
def cancel_fine_tune(job_id: JobId, user: CurrentUser, db: DbDep) -> Response:
    """A queued job is cancelled at once; a running one becomes `cancel_requested` and stops within a step."""
    job = fine_tunes.cancel(db, user, job_id)
    return JSONResponse(fine_tunes.job_object(job, fine_tunes.validation_blocks(db, [job]).get(job_id)))


@router.get(
    "/{job_id}/events",
    summary="A fine-tune's events",
    responses={
        200: {
            "model": schemas.EventList,
            "content": {
                "text/event-stream": {
                    "schema": {"type": "string"},
                    "example": 'id: 41\ndata: {"id": 41, "object": "fine_tune.event", "created_at": '
                    '"2026-01-01T00:00:00Z", "step": 10, "loss": 0.21}\n\ndata: [DONE]\n\n',
                }
            },
            "description": "A page of events, oldest first; or, with stream=true (or Accept: "
            "text/event-stream), a live stream of server-sent events: each message's `id` is the "
            "event's id (send it back as Last-Event-ID to resume) and its `data` one event as JSON, "
            "shaped as EventOut; comment lines keep the connection alive; the last message is "
            "`data: [DONE]`, once the job has ended.",
        },
        **schemas.NOT_FOUND,
    },
)
def fine_tune_events_route(
    job_id: JobId,
    request: Request,
    user: CurrentUser,
    settings: SettingsDep,
    after: EventAfter = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    stream: Annotated[bool, Query(description="Stream events as they happen (server-sent events).")] = False,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    if stream or "text/event-stream" in request.headers.get("accept", ""):
        with read_db(request) as db:
            fine_tunes.get(db, user, job_id)  # 404 unless it is the caller's
        start = after
        resume_after = event_id_from_header(last_event_id)
        if resume_after is not None:
            start = max(start or 0, resume_after)
        db_sessions = request.app.state.readers
        return EventSourceResponse(
            _follow(db_sessions, job_id, start, settings.events_poll_seconds, request), ping=15
        )
    with read_db(request) as db:
        rows, has_more = fine_tunes.events_page(db, user, job_id, after, limit)  # 404 unless the caller's
    data = [event_rows.event_object(r) for r in rows]
    return JSONResponse({"object": "list", "data": data, "has_more": has_more})


async def _follow(
    db_sessions: Any, job_id: str, after: int | None, poll: float, request: Request
) -> AsyncIterator[dict[str, str]]:
    """Events as they are written, until the job has ended and every event was sent."""
    last = after
    while True:
        status, rows = await run_in_threadpool(_status_and_events, db_sessions, job_id, last)
        for row in rows:
            last = row["id"]
            yield {"id": str(row["id"]), "data": json.dumps(event_rows.event_object(row))}
        if rows:
            continue
        if status in st.TERMINAL:
            yield {"data": "[DONE]"}
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(poll)


def _status_and_events(db_sessions: Any, job_id: str, after: int | None) -> tuple[str, list[dict[str, Any]]]:
    # The status first: every event of an ended job was committed before its final status.
    with db_sessions() as db:
        status = db.execute(
            fine_tunes_table.select()
            .with_only_columns(fine_tunes_table.c.status)
            .where(fine_tunes_table.c.id == job_id)
        ).scalar()
        query = fine_tune_events.select().where(fine_tune_events.c.job_id == job_id)
        if after is not None:
            query = query.where(fine_tune_events.c.id > after)
        rows = db.execute(query.order_by(fine_tune_events.c.id).limit(500)).mappings().all()
    return status, [dict(r) for r in rows]


@router.get(
    "/{job_id}/files",
    summary="A fine-tune's files",
    responses={200: {"model": schemas.FileList}, **schemas.NOT_FOUND},
)
def list_files(job_id: JobId, request: Request, user: CurrentUser, settings: SettingsDep) -> Response:
    """The output (once completed: model.safetensors, configs, processors, norm stats) and the checkpoints,
    each with its size and sha256."""
    with read_db(request) as db:
        job = fine_tunes.get(db, user, job_id)
    checksums = request.app.state.checksums
    return JSONResponse({"object": "list", "data": listing(job, settings.job_dir(job_id), checksums)})


_FILE_HEADERS = {
    "content-length": {"schema": {"type": "integer"}, "description": "The file's size in bytes."},
    "x-checksum-sha256": {"schema": {"type": "string"}, "description": "The file's sha256, in hex."},
    "repr-digest": {"schema": {"type": "string"}, "description": "The same sha256, as RFC 9530 writes it."},
}


# HEAD answers what GET would, without the body (Starlette's FileResponse sends headers only): a
# client learns a file's size and sha256 before it downloads, or checks a copy it has.
@router.head(
    "/{job_id}/files/{path:path}",
    summary="A file's size and sha256, without the file",
    response_class=FileResponse,
    responses={
        200: {"description": "The headers a download would have; no body.", "headers": _FILE_HEADERS},
        **schemas.NOT_FOUND,
    },
)
@router.get(
    "/{job_id}/files/{path:path}",
    summary="Download a file",
    response_class=FileResponse,
    responses={
        200: {
            "description": "The file. `x-checksum-sha256` (and `repr-digest`) carry its sha256; "
            "send `Range: bytes=N-` to resume a download.",
            "headers": _FILE_HEADERS,
        },
        **schemas.NOT_FOUND,
    },
)
def download_file(
    job_id: JobId,
    path: str,
    request: Request,
    user: CurrentUser,
    settings: SettingsDep,
) -> Response:
    with read_db(request) as db:
        job = fine_tunes.get(db, user, job_id)
    work_dir = settings.job_dir(job_id)
    full, sha256 = resolve(job, work_dir, path)
    served, done = full, None
    if sha256 is None:  # a checkpoint's file: pinned, so that pruning cannot cut the download short
        served = pin(work_dir, full, job_id, path)
        done = BackgroundTask(unpin, served)
        try:
            sha256 = request.app.state.checksums.sha256(served)
        except BaseException:
            unpin(served)
            raise
    digest = base64.b64encode(bytes.fromhex(sha256)).decode()
    return FileResponse(
        served,
        filename=full.name,
        content_disposition_type="attachment",
        headers={"x-checksum-sha256": sha256, "repr-digest": f"sha-256=:{digest}:"},
        background=done,
    )
