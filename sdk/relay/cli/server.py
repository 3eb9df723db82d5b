"""`relay server`: the embedded service for a laptop."""

from __future__ import annotations

import typer

from relay.cli._extras import require


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
) -> None:
    """Run the API and one worker with SQLite and a broker that needs no server.

    Data lives in RELAY_HOME (default ~/.relay); the URL and a local API key are written to
    client.json there, where the SDK and `relay fine-tunes` find them.
    """
    embedded = require("relay_api.embedded")
    embedded.serve(host, port, log=lambda line: typer.echo(line, err=False))
