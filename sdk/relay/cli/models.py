"""`relay models`."""

from __future__ import annotations

import typer

app = typer.Typer(help="models", no_args_is_help=True)
