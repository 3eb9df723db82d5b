"""`relay keys`."""

from __future__ import annotations

import typer

app = typer.Typer(help="keys", no_args_is_help=True)
