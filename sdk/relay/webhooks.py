"""Webhooks: the service POSTs a signed event to a URL of yours when one of your jobs ends
(docs/api.md, "Webhooks"). ``client.webhooks.create(url=...)``, ``.list()``, ``.retrieve(id)``,
``.delete(id)``, ``.deliveries(id)``.

The shapes here are the API's own (relay_api.schemas imports them): what a webhook may be created
with (WebhookConfig, whose rules the API's 400s quote), a webhook, and a delivery.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from relay.rules import PLAIN_TEXT_PATTERN, CheckedConfig, has_control_characters
from relay.sft import status as st

if TYPE_CHECKING:
    from relay.http_client import Client

WEBHOOKS = "/v1/webhooks"

FINE_TUNE_SUCCEEDED = "fine_tune.succeeded"
FINE_TUNE_FAILED = "fine_tune.failed"
FINE_TUNE_CANCELLED = "fine_tune.cancelled"
# A closed-loop evaluation of a running job finished (an `eval` event, at a checkpoint or the end):
# one event per evaluation, its step in the event's data.
FINE_TUNE_EVALUATED = "fine_tune.evaluated"
# The event each terminal status of a recipe job (relay.sft.status.TERMINAL) sends.
EVENT_OF_STATUS: dict[str, str] = {
    st.COMPLETED: FINE_TUNE_SUCCEEDED,
    st.ERROR: FINE_TUNE_FAILED,
    st.CANCELLED: FINE_TUNE_CANCELLED,
}
EVENT_TYPES: tuple[str, ...] = (
    FINE_TUNE_SUCCEEDED,
    FINE_TUNE_FAILED,
    FINE_TUNE_CANCELLED,
    FINE_TUNE_EVALUATED,
)
EventType = Literal["fine_tune.succeeded", "fine_tune.failed", "fine_tune.cancelled", "fine_tune.evaluated"]

URL_MAX = 2048
DESCRIPTION_MAX = 500
DELIVERY_STATUSES = ("pending", "delivered", "failed")

URL_RULE = f"must be an http:// or https:// URL with a host, at most {URL_MAX} characters"
EVENTS_RULE = "must be a non-empty list of event types from: " + ", ".join(EVENT_TYPES)
DESCRIPTION_RULE = f"must be text of at most {DESCRIPTION_MAX} characters, no control characters"


def _receiver_url(value: str) -> str:
    if len(value) > URL_MAX or has_control_characters(value) or any(ch.isspace() for ch in value):
        raise ValueError(URL_RULE)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number, or out of range)
    except ValueError:
        raise ValueError(URL_RULE) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(URL_RULE)
    return value


def _known_events(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    if not value or any(event not in EVENT_TYPES for event in value):
        raise ValueError(EVENTS_RULE)
    return list(dict.fromkeys(value))  # each once, in the order given


ReceiverUrl = Annotated[
    str,
    AfterValidator(_receiver_url),
    WithJsonSchema({"type": "string", "format": "uri", "maxLength": URL_MAX, "pattern": "^https?://"}),
]
EventTypes = Annotated[
    list[str] | None,
    AfterValidator(_known_events),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "array", "items": {"type": "string", "enum": list(EVENT_TYPES)}, "minItems": 1},
                {"type": "null"},
            ]
        }
    ),
]


class WebhookConfig(CheckedConfig):
    """What a webhook is created with: where to POST, which events (all of them when left out)."""

    RULES: ClassVar[dict[str, str]] = {
        "url": URL_RULE,
        "events": EVENTS_RULE,
        "description": DESCRIPTION_RULE,
    }
    WHAT: ClassVar[str] = "a webhook"
    BODY_MESSAGE: ClassVar[str] = "the body must be an object with a webhook's fields: {fields}"

    url: ReceiverUrl
    events: EventTypes = None
    description: str | None = Field(None, max_length=DESCRIPTION_MAX, pattern=PLAIN_TEXT_PATTERN)


class Webhook(BaseModel):
    """A webhook. `secret` is shown once, in the answer that created it, and null afterwards."""

    model_config = ConfigDict(extra="forbid")

    id: str
    object: Literal["webhook"] = "webhook"
    url: str
    events: list[EventType]
    description: str | None
    created_at: str
    secret: str | None = Field(
        None,
        description="`whsec_` + base64 of 32 random bytes, the key of the messages' signatures "
        "(Standard Webhooks). Only in the answer to the create; keep it then.",
    )


class WebhookList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Webhook]
    has_more: bool


class WebhookDelivery(BaseModel):
    """One event to one webhook and how sending it went: `pending` (to be sent, or sent again at
    `next_attempt_at`), `delivered` (a 2xx answer), `failed` (given up after its attempts)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The event's id, `evt_...`: the `webhook-id` of every attempt.")
    object: Literal["webhook.delivery"] = "webhook.delivery"
    webhook_id: str
    type: EventType
    job_id: str
    step: int | None = Field(
        None,
        description="The step of the evaluation a `fine_tune.evaluated` event is of; null for the others.",
    )
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_response_code: int | None
    last_error: str | None
    next_attempt_at: str | None = Field(description="Null once delivered or failed.")
    created_at: str
    delivered_at: str | None


class WebhookDeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookDelivery]
    has_more: bool


class Webhooks:
    """The webhooks of the client's user: ``client.webhooks``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self, url: str, events: Sequence[str] | None = None, description: str | None = None
    ) -> Webhook:
        """A new webhook; its `secret` is in this answer only."""
        chosen = None if events is None else [*events]
        body = WebhookConfig(url=url, events=chosen, description=description)  # refused here first
        created = self._client.request("POST", WEBHOOKS, json_body=body.model_dump(exclude_none=True))
        return Webhook.model_validate(created)

    def list(self, page_size: int = 100) -> Iterator[Webhook]:
        """Every webhook, newest first (pages fetched as needed)."""
        for item in self._pages(WEBHOOKS, page_size):
            yield Webhook.model_validate(item)

    def retrieve(self, webhook_id: str) -> Webhook:
        return Webhook.model_validate(self._client.request("GET", f"{WEBHOOKS}/{webhook_id}"))

    def delete(self, webhook_id: str) -> Webhook:
        """Delete it: no event is sent to it any more, pending deliveries included."""
        deleted = self._client.request("DELETE", f"{WEBHOOKS}/{webhook_id}", retry=True)
        return Webhook.model_validate(deleted)

    def deliveries(self, webhook_id: str, page_size: int = 100) -> Iterator[WebhookDelivery]:
        """Its deliveries, newest first."""
        for item in self._pages(f"{WEBHOOKS}/{webhook_id}/deliveries", page_size):
            yield WebhookDelivery.model_validate(item)

    def _pages(self, path: str, page_size: int) -> Iterator[dict[str, Any]]:
        after: str | None = None
        while True:
            page = self._client.request("GET", path, params={"after": after, "limit": page_size})
            yield from page["data"]
            if not page["has_more"] or not page["data"]:
                return
            after = page["data"][-1]["id"]
