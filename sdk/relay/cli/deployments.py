"""`relay deployments`: deploy a model to serve robots, list, show and stop deployments."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from relay import http_client
from relay.cli._common import clear_errors, console, err, show_record, show_table, status_text
from relay.serving import deployment as deployments
from relay.serving import status as st
from relay.serving.config import DeploymentConfig

app = typer.Typer(
    help="Deployments (relay.serving): serve a tuned policy to robots over HTTP and openpi's websocket.",
    no_args_is_help=True,
)
out = console()


@app.command()
def create(
    model: str = typer.Argument(
        ...,
        help="A completed fine-tune's id (ft-...), a session's saved weights (ses-.../NAME) or a base model.",
    ),
    max_batch: int = typer.Option(
        DeploymentConfig.default("max_batch"), help="Requests (from any robots) in one forward pass, at most."
    ),
    max_wait_ms: float = typer.Option(
        DeploymentConfig.default("max_wait_ms"), help="How long a batch's first request waits for others."
    ),
    idle_timeout: float = typer.Option(
        DeploymentConfig.default("idle_timeout_seconds"),
        "--idle-timeout",
        help="Seconds without a request (and no robot connected) before it stops.",
    ),
    gpus: int = typer.Option(DeploymentConfig.default("gpus"), help="GPUs to serve on."),
    wait: bool = typer.Option(False, "--wait", help="Wait until it is ready."),
    as_json: bool = typer.Option(False, "--json", help="Print the deployment as JSON."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Print only the deployment's id (for scripts: DEP=$(... -q))."
    ),
) -> None:
    """Deploy a model; prints the deployment (its websocket_url is where openpi-client connects)."""
    with clear_errors():
        deployment = deployments.deploy(
            model, gpus=gpus, max_batch=max_batch, max_wait_ms=max_wait_ms, idle_timeout_seconds=idle_timeout
        )
        if wait:
            deployment.wait_ready()
    if quiet:
        print(deployment.id)
    else:
        show_record(deployment.to_dict(), as_json)


@app.command("list")
def list_(
    limit: int = typer.Option(20, min=1, max=100, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines."),
) -> None:
    """Your deployments, newest first."""
    with clear_errors():
        found, _ = deployments.list_deployments(limit=limit)
    if as_json:
        for deployment in found:
            print(json.dumps(deployment.to_dict()))
        return
    table = Table()
    for column in ("id", "status", "model", "req/s", "p50 ms", "robots", "created"):
        table.add_column(column, no_wrap=column in ("id", "status"), min_width=16 if column == "id" else None)
    for deployment in found:
        stats = deployment.stats or {}
        p50 = (stats.get("latency_ms") or {}).get("p50")
        table.add_row(
            deployment.id,
            status_text(deployment.status),
            deployment.model,
            f"{stats['requests_per_second']:.1f}" if stats else "-",
            f"{p50:.1f}" if p50 is not None else "-",
            str(stats.get("clients", "-")),
            (deployment.created_at or "")[:16].replace("T", " "),
        )
    show_table(table, out, json_hint=True)


@app.command()
def show(
    deployment_id: str, as_json: bool = typer.Option(False, "--json", help="Print the deployment as JSON.")
) -> None:
    """One deployment as the API reports it now: status, websocket_url, stats (an ended one says why)."""
    with clear_errors():
        show_record(deployments.retrieve(deployment_id).to_dict(), as_json)


@app.command()
def stop(
    deployment_id: str,
    wait: bool = typer.Option(
        True, "--wait/--no-wait", help="Wait until its worker lets go (a few seconds): it reads stopped."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the deployment as JSON."),
) -> None:
    """Stop serving: robots connected are disconnected, and its worker is freed."""
    with clear_errors():
        deployment = deployments.Deployment({"id": deployment_id}, http_client.default_client())
        if wait and not as_json:
            err.print(f"stopping {deployment_id}: waiting for its worker to let go", highlight=False)
        deployment.stop(wait=wait)
    show_record(deployment.to_dict(), as_json)
    if not as_json and deployment.status not in st.ENDED:
        err.print("stopping: its worker lets go within seconds (relay deployments show)", highlight=False)
