"""`relay datasets`."""

from __future__ import annotations

import typer

app = typer.Typer(help="datasets", no_args_is_help=True)
