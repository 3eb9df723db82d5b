"""`relay server`: the embedded service for a laptop."""

from __future__ import annotations

import typer


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
) -> None:
    """Run the API and one worker with SQLite and a broker that needs no server."""
    raise typer.Exit(1)
