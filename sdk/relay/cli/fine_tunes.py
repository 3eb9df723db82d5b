"""`relay fine-tunes`."""

from __future__ import annotations

import typer

app = typer.Typer(help="fine-tunes", no_args_is_help=True)
