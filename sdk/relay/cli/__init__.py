"""The `relay` command.

Each group lives in its own module. Groups that need the engine or the server import them
inside their commands, so `relay fine-tunes ...` works with the SDK alone and the others say
which extra to install.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer

from relay.cli import (
    cache,
    datasets,
    deployments,
    evaluation,
    fine_tunes,
    keys,
    local,
    models,
    serve,
    server,
    sessions,
    webhooks,
)

app = typer.Typer(
    name="relay",
    help="Fine-tune pi0.5 robot policies on LeRobot datasets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(datasets.app, name="datasets")
app.add_typer(models.app, name="models")
app.add_typer(local.app, name="local")
app.add_typer(fine_tunes.app, name="fine-tunes")
app.add_typer(sessions.app, name="sessions")
app.add_typer(deployments.app, name="deployments")
app.add_typer(webhooks.app, name="webhooks")
app.add_typer(keys.app, name="keys")
app.add_typer(cache.app, name="cache")
app.command("server")(server.serve)
app.command("eval")(evaluation.evaluate)
app.command("serve")(serve.serve)


def _version() -> str:
    try:
        return version("relay-intelligence")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"relay {_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(
        False, "--version", help="Print Relay's version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """Fine-tune pi0.5 robot policies on LeRobot datasets."""


def main() -> None:
    app()
