"""`relay keys`: API keys for the service's users (run where the service's database is reachable)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from relay.cli._common import err, fail, show_table
from relay.cli._extras import require

app = typer.Typer(
    help="API keys: create, list, revoke. Uses the service's database (RELAY_DATABASE_URL).",
    no_args_is_help=True,
)


@app.command()
def create(
    user: str = typer.Option(..., "--user", help="The user the key belongs to (created if new)."),
    as_json: bool = typer.Option(False, "--json", help="Print {user, key} as JSON."),
) -> None:
    """Create a key for USER and print it. It is shown only this once; the database keeps its hash."""
    keys = require("relay_api.keys")
    with _database() as session:
        try:
            new = keys.create_key(session, user)
        except ValueError as error:
            err.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
    if as_json:
        print(json.dumps({"user": new.user, "key": new.key}))
    else:
        err.print(f"API key for {new.user} (shown once; use it as RELAY_API_KEY):", highlight=False)
        print(new.key)


@app.command("list")
def list_() -> None:
    """Every key: its user, its first characters, when it was made and revoked."""
    keys = require("relay_api.keys")
    with _database() as session:
        rows = keys.list_keys(session)
    table = Table("user", "key", "created", "revoked")
    for user, prefix, created, revoked in rows:
        table.add_row(user, prefix + "...", created[:19], (revoked or "")[:19])
    show_table(table)


@app.command()
def revoke(
    key: str = typer.Argument(..., help="The key, or its first characters as `relay keys list` shows."),
    user: str | None = typer.Option(None, "--user", help="Only this user's keys (for a shared prefix)."),
) -> None:
    """Revoke one key; every API process refuses it within a second. A prefix that matches several
    active keys revokes none: give the whole key, or --user."""
    keys = require("relay_api.keys")
    with _database() as session:
        try:
            count = keys.revoke_keys(session, key.removesuffix("..."), user)
        except ValueError as error:
            fail(str(error))
    if not count:
        fail(f"no active key matches {key}" + (f" among {user}'s" if user else ""))
    err.print("revoked 1 key")


@contextmanager
def _database() -> Iterator[Any]:
    """A session on the service's database, or a clear exit if it is unreachable or not migrated."""
    db = require("relay_api.db")
    settings = require("relay_api.settings").get_settings()
    sqlalchemy_errors = require("sqlalchemy.exc")
    if settings.uses_sqlite and not settings.home.exists():
        fail(
            f"no Relay data directory at {settings.home}: start `relay server` there once, "
            "or set RELAY_HOME / RELAY_DATABASE_URL"
        )
    try:
        with db.session_factory(settings)() as session:
            yield session
    except (sqlalchemy_errors.OperationalError, sqlalchemy_errors.ProgrammingError) as error:
        fail(
            f"cannot use the database at {settings.database_url}: {error.orig}. "
            "Is it up and migrated (`python -m relay_api.migrate`)?"
        )
