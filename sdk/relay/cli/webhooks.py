"""`relay webhooks`: register a URL that is POSTed a signed event when one of your jobs ends; list,
delete, and see what was delivered."""

from __future__ import annotations

import json
from itertools import islice

import typer
from rich.table import Table

from relay import http_client
from relay.cli._common import clear_errors, err, out, show_record, show_table, status_text
from relay.webhooks import EVENT_TYPES

app = typer.Typer(
    help="Webhooks: a signed POST to your URL when a job succeeds, fails, is cancelled or is evaluated.",
    no_args_is_help=True,
)


@app.command()
def create(
    url: str = typer.Argument(..., help="Where to POST: an http:// or https:// URL."),
    event: list[str] = typer.Option(
        [], "--event", help=f"An event type to send (repeat it); default: all ({', '.join(EVENT_TYPES)})."
    ),
    description: str | None = typer.Option(None, help="A note of yours, at most 500 characters."),
    as_json: bool = typer.Option(False, "--json", help="Print the webhook as JSON."),
) -> None:
    """Create a webhook; prints it with its secret, which is never shown again."""
    with clear_errors():
        webhook = http_client.default_client().webhooks.create(
            url, events=event or None, description=description
        )
    show_record(webhook.model_dump(mode="json"), as_json)
    if not as_json:
        err.print(
            "keep the secret: it verifies the events' signatures, and is not shown again", highlight=False
        )


@app.command("list")
def list_(
    limit: int = typer.Option(20, min=1, max=100, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines."),
) -> None:
    """Your webhooks, newest first."""
    with clear_errors():
        found = list(islice(http_client.default_client().webhooks.list(page_size=limit), limit))
    if as_json:
        for webhook in found:
            print(json.dumps(webhook.model_dump(mode="json")))
        return
    table = Table()
    for column in ("id", "url", "events", "created"):
        table.add_column(column, no_wrap=column == "id")
    for webhook in found:
        table.add_row(
            webhook.id, webhook.url, ", ".join(webhook.events), webhook.created_at[:16].replace("T", " ")
        )
    show_table(table, out, json_hint=True)


@app.command()
def delete(
    webhook_id: str, as_json: bool = typer.Option(False, "--json", help="Print the deleted webhook as JSON.")
) -> None:
    """Delete a webhook: nothing more is sent to it, pending retries included."""
    with clear_errors():
        webhook = http_client.default_client().webhooks.delete(webhook_id)
    show_record(webhook.model_dump(mode="json"), as_json)


@app.command()
def deliveries(
    webhook_id: str,
    limit: int = typer.Option(20, min=1, max=100, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines."),
) -> None:
    """A webhook's deliveries, newest first: status, attempts, the last answer."""
    with clear_errors():
        found = list(
            islice(http_client.default_client().webhooks.deliveries(webhook_id, page_size=limit), limit)
        )
    if as_json:
        for delivery in found:
            print(json.dumps(delivery.model_dump(mode="json")))
        return
    table = Table()
    for column in ("event", "type", "job", "status", "attempts", "last answer", "next attempt"):
        table.add_column(column, no_wrap=column in ("event", "status"))
    for delivery in found:
        answer = str(delivery.last_response_code or delivery.last_error or "-")
        table.add_row(
            delivery.id,
            delivery.type,
            delivery.job_id,
            status_text(delivery.status),
            str(delivery.attempts),
            answer,
            (delivery.next_attempt_at or "-")[:19].replace("T", " "),
        )
    show_table(table, out, json_hint=True)
