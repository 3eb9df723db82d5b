"""Import the heavy parts of Relay from the CLI, with a clear message when an extra is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

import typer

_EXTRA_OF = {
    "relay_engine": "engine",
    "relay_api": "server",
    "relay_worker": "server",
}


def require(module: str) -> ModuleType:
    """Import `module`, or exit 1 with the pip command that installs the extra it needs."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        extra = _EXTRA_OF.get(module.split(".")[0], "engine")
        typer.secho(
            f"error: this command needs Relay's {extra} extra ({error.name or error} is missing): "
            f'pip install "relay-intelligence[{extra}]"',
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1) from None
