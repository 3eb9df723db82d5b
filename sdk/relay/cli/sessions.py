"""`relay sessions`: list, show and close training-loop sessions, and list the states they saved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.table import Table

from relay.cli._common import console, fail, show_record, show_table, status_text
from relay.errors import APIError
from relay.formatting import size_text
from relay.training import ServiceClient

app = typer.Typer(
    help="Training-loop sessions (relay.training): list, show, close; and the states they saved.",
    no_args_is_help=True,
)
out = console()


@contextmanager
def _service() -> Iterator[ServiceClient]:
    """The service, with a refused request or an unreachable server as a message and exit 1."""
    service = ServiceClient(progress=False)
    try:
        yield service
    except APIError as error:
        fail(str(error))
    finally:
        service.close()


@app.command("list")
def list_(
    limit: int = typer.Option(20, min=1, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines."),
) -> None:
    """Your sessions, newest first."""
    with _service() as service:
        sessions = service.list_sessions(limit=limit)
    if as_json:
        for session in sessions:
            print(json.dumps(session))
        return
    table = Table()
    # Targets and the worker are in `show`; this keeps the table within 80 columns.
    for column in ("id", "status", "model", "calls", "steps", "states", "created"):
        table.add_column(
            column,
            no_wrap=column in ("id", "status"),
            overflow="fold",
            min_width=16 if column == "id" else None,
        )
    for session in sessions:
        table.add_row(
            session["id"],
            status_text(session["status"]),
            f"{session['base_model']} {_method(session)}",
            str(session.get("calls", "-")),
            str(session.get("steps", "-")),
            str(session.get("saved_states", "-")),
            (session.get("created_at") or "")[:16].replace("T", " "),
        )
    show_table(table, out, json_hint=True)


@app.command()
def show(
    session_id: str, as_json: bool = typer.Option(False, "--json", help="Print the session as JSON.")
) -> None:
    """One session, as the API reports it now (an ended one says why in `error`)."""
    with _service() as service:
        show_record(service.retrieve_session(session_id), as_json)


@app.command()
def close(
    session_id: str, as_json: bool = typer.Option(False, "--json", help="Print the session as JSON.")
) -> None:
    """Close a session (its program's calls already sent run first) and free its worker."""
    with _service() as service:
        show_record(service.close_session(session_id), as_json)


@app.command()
def states(as_json: bool = typer.Option(False, "--json", help="Print JSON lines.")) -> None:
    """The states your sessions saved (save_state), newest first: load_state takes the name."""
    with _service() as service:
        saved = service.list_states()
    if as_json:
        for state in saved:
            print(json.dumps(state))
        return
    table = Table()
    for column in ("name", "model", "finetune", "targets", "size", "saved"):
        table.add_column(column, no_wrap=column not in ("name", "targets"), overflow="fold")
    for state in saved:
        table.add_row(
            state["name"],
            state.get("base_model") or "?",
            _method(state),
            ", ".join(state.get("targets") or []),
            size_text(state["bytes"]),
            (state.get("saved_at") or "")[:19],
        )
    show_table(table, out, json_hint=True)


def _method(record: dict[str, Any]) -> str:
    """`lora r32` or `full`: how it trains, in one cell (a server from before sessions said
    `lora_rank` says `rank`)."""
    rank = record.get("lora_rank", record.get("rank"))
    if record.get("finetune") == "lora" and rank is not None:
        return f"lora r{rank}"
    return str(record.get("finetune") or "?")
