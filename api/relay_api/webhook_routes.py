"""/v1/webhooks: a user's receivers of signed job events (docs/api.md, "Webhooks").

The routes only write and read rows; the workers' dispatcher (relay_worker.webhook_dispatch) sends
the events, so no request ever waits on a receiver.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response

from relay.errors import ConfigError
from relay.webhooks import WebhookConfig
from relay_api import schemas, webhooks
from relay_api.deps import CurrentUser, DbDep, SettingsDep, read_db
from relay_api.errors import APIProblem
from relay_api.openapi import inline_schema
from relay_api.params import PageAfter, PageLimit, WebhookId
from relay_api.responses import JSONResponse
from relay_api.webhook_addresses import PRIVATE_RULE, refusal_at_create

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=schemas.ERRORS)


@router.post(
    "",
    summary="Create a webhook",
    responses={200: {"model": schemas.WebhookOut}},
    # The body is parsed by WebhookConfig itself (for its messages); the document shows its schema.
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_schema(WebhookConfig)}},
        }
    },
)
def create_webhook(
    user: CurrentUser,
    db: DbDep,
    settings: SettingsDep,
    body: Annotated[Any, Body(include_in_schema=False)] = None,
) -> Response:
    """`{"url", "events" (default: every type), "description"}`: the webhook, with its `secret`, which
    no later answer shows. Each of your jobs that ends after this is POSTed to `url`, signed."""
    try:
        config = WebhookConfig.parse(body)
    except ConfigError as error:
        raise APIProblem(400, error.message, param=error.param, code=error.code) from None
    host = urlsplit(config.url).hostname or ""
    refusal = None if settings.webhook_private_addresses else refusal_at_create(host)
    if refusal is not None:
        message = f"bad url: {json.dumps(config.url)} ({PRIVATE_RULE}; {refusal})"
        raise APIProblem(400, message, param="url", code="invalid_value")
    return JSONResponse(webhooks.create(db, user, config, settings))


@router.get(
    "",
    summary="List your webhooks, newest first",
    responses={200: {"model": schemas.WebhookList}, **schemas.NOT_FOUND},
)
def list_webhooks(
    user: CurrentUser, request: Request, after: PageAfter = None, limit: PageLimit = 20
) -> Response:
    with read_db(request) as db:
        rows, has_more = webhooks.list_page(db, user, after, limit)
    data = [webhooks.webhook_object(r) for r in rows]
    return JSONResponse({"object": "list", "data": data, "has_more": has_more})


@router.get(
    "/{webhook_id}",
    summary="Retrieve a webhook",
    responses={200: {"model": schemas.WebhookOut}, **schemas.NOT_FOUND},
)
def retrieve_webhook(webhook_id: WebhookId, user: CurrentUser, request: Request) -> Response:
    with read_db(request) as db:
        row = webhooks.get(db, user, webhook_id)
    return JSONResponse(webhooks.webhook_object(row))


@router.delete(
    "/{webhook_id}",
    summary="Delete a webhook",
    responses={200: {"model": schemas.WebhookOut}, **schemas.NOT_FOUND},
)
def delete_webhook(webhook_id: WebhookId, user: CurrentUser, db: DbDep) -> Response:
    """Nothing more is sent to it, pending retries included; its deliveries go with it."""
    return JSONResponse(webhooks.webhook_object(webhooks.remove(db, user, webhook_id)))


@router.get(
    "/{webhook_id}/deliveries",
    summary="A webhook's deliveries, newest first",
    responses={200: {"model": schemas.WebhookDeliveryList}, **schemas.NOT_FOUND},
)
def webhook_deliveries(
    webhook_id: WebhookId,
    user: CurrentUser,
    request: Request,
    after: PageAfter = None,
    limit: PageLimit = 20,
) -> Response:
    """Each event sent (or to be sent) to it: its status, attempts, the last answer's code or error,
    and when the next attempt is due."""
    with read_db(request) as db:
        data, has_more = webhooks.deliveries_page(db, user, webhook_id, after, limit)
    return JSONResponse({"object": "list", "data": data, "has_more": has_more})
