"""`relay local`."""

from __future__ import annotations

import typer

app = typer.Typer(help="local", no_args_is_help=True)
