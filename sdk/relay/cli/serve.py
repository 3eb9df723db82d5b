"""`relay serve`: a tuned policy served on this machine, for a robot's own GPU (or a tuned RT-J,
answering predictions for rows of its database).

The same policy server a deployment's worker runs (`relay_worker.serving.server`), imported when
the command runs: HTTP actions, openpi's websocket protocol, requests from several robots
batched into one forward pass. Loopback by default; any other address needs an API key.
"""

from __future__ import annotations

import ipaddress
import sys
import threading
from pathlib import Path
from typing import Any

import typer

from relay import families, sft
from relay.cli._common import err, fail
from relay.cli._extras import require
from relay.errors import APIError, InputError
from relay.serving.config import SERVED_BASE_MODELS

MODEL_FILE = "model.safetensors"
API_KEY_ENV = "RELAY_SERVE_API_KEY"


def serve(
    model: str = typer.Argument(
        ...,
        help="A model directory (a job's downloaded output, a work directory), a completed job's id "
        "(its output is downloaded into ./JOB_ID unless it is there) or a base model (pi05-tiny).",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback unless an API key is set)."),
    # Not `relay server`'s 8000, so that both run on one machine (that port is the SDK's default).
    port: int = typer.Option(8001, help="Port to listen on (0: any free port)."),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar=API_KEY_ENV,
        help="Clients must send it (Authorization: Bearer KEY, or Api-Key KEY). "
        f"Also read from {API_KEY_ENV}.",
    ),
    max_batch: int = typer.Option(8, help="Requests answered in one forward pass, at most."),
    max_wait_ms: float = typer.Option(2.0, help="How long a request waits for others to join its batch."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    database: str | None = typer.Option(
        None,
        help="An RT-J's database directory, when it is not where the job read it "
        "(the model's config.json records that), or a database URL (read now, as one snapshot).",
    ),
    task: str | None = typer.Option(None, help="An RT-J's task, when its config.json names none."),
) -> None:
    """Serve MODEL's actions over HTTP and openpi's websocket protocol (an RT-J: predictions for
    rows of its database over HTTP) until Ctrl-C."""
    if not _is_loopback(host) and not api_key:
        err.print(
            f"[red]error:[/red] --host {host} is reachable from other machines: give --api-key KEY "
            f"(or set {API_KEY_ENV}) so that only your robots are served, or serve on 127.0.0.1",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)
    server_module = require("relay_worker.serving.server")
    errors = require("relay_engine.errors")
    where = _model_path(model)
    options = server_module.ServingOptions(
        max_batch=max_batch, max_wait_ms=max_wait_ms, device=device, database=database, task=task
    )
    try:
        server = server_module.start_policy_server(
            where, host=host, port=port, token=api_key, options=options
        )
    except (errors.EngineError, ValueError) as error:
        fail(str(error))
    instructions = _rtj_instructions if server.metadata.get("answers") == "predictions" else _instructions
    typer.echo(instructions(server.url, server.metadata, api_key))
    sys.stdout.flush()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        err.print("stopping", highlight=False)
    finally:
        server.stop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _model_path(model: str) -> str:
    """A directory or a base model as given; anything else is a job: its downloaded output in
    ./JOB_ID (where `relay fine-tunes download` puts it), fetched there first when missing."""
    # A name of any family's model goes to its family, which says whether it serves a base by name.
    if Path(model).expanduser().is_dir() or model in families.model_names():
        return model
    target = Path(model)
    if (target / MODEL_FILE).is_file():
        return str(target)
    err.print(f"{model} is not a directory or a base model: downloading job {model}'s output into ./{model}")
    try:
        sft.retrieve(model).download(target)
    except (APIError, InputError, RuntimeError) as error:
        fail(
            f"{model}: not a model directory, a base model ({', '.join(SERVED_BASE_MODELS)}) or a job "
            f"Relay has: {error}"
        )
    return str(target)


def _instructions(url: str, metadata: dict[str, Any], api_key: str | None) -> str:
    """Where the server is and how a robot program talks to it."""
    host_port = url.removeprefix("http://")
    host, _, port = host_port.rpartition(":")
    cameras = metadata["cameras"]
    state_dim = metadata["state_dim"]
    state_text = f"{state_dim} numbers" if state_dim is not None else "up to 32 normalized numbers"
    key = "KEY" if api_key else "None"
    # A tuned model needs every camera it was trained with; a base model takes any of its slots.
    required = metadata.get("cameras_required", True)
    shown = cameras if required else cameras[:1]
    images = ", ".join(f'"{camera}": {_image_name(camera)}' for camera in shown)
    image_note = ", ".join(_image_name(camera) for camera in shown)
    auth = ' -H "Authorization: Bearer KEY"' if api_key else ""
    png = ", ".join(f'"{camera}": "<base64 PNG>"' for camera in shown)
    return "\n".join(
        [
            f"serving {metadata['model']} ({metadata['device']}); Ctrl-C stops",
            f"  HTTP:      {url}/actions  (also /metadata, /stats, /healthz)",
            f"  websocket: ws://{host_port}/  (openpi's protocol)",
            f"  cameras:   {', '.join(cameras)}; state: {state_text}; "
            f"actions: {metadata['action_horizon']} x {metadata['action_dim']}"
            + (" in the robot's units" if metadata["raw_units"] else " (normalized: the model has no stats)"),
            "",
            "# pip install openpi-client typing_extensions",
            "from openpi_client.websocket_client_policy import WebsocketClientPolicy",
            f'policy = WebsocketClientPolicy(host="{host}", port={port}, api_key={key})',
            f"# {image_note}: a uint8 (height, width, 3) array each"
            + ("" if required else f" (any of {', '.join(cameras)})")
            + f"; state: {state_text}",
            f'result = policy.infer({{"images": {{{images}}}, "state": state, "prompt": "...", "seed": 7}})',
            'chunk = result["actions"]',
            "",
            f"curl {url}/actions{auth} -H 'Content-Type: application/json' \\",
            f'  -d \'{{"observation": {{"images": {{{png}}}, '
            f'"state": [...], "prompt": "..."}}, "seed": 7}}\'',
        ]
    )


def _image_name(camera: str) -> str:
    """A Python name for a camera's image in the snippet: base_0_rgb -> base_0_rgb_image."""
    return "".join(c if c.isalnum() else "_" for c in camera.rsplit(".", 1)[-1]) + "_image"


def _rtj_instructions(url: str, metadata: dict[str, Any], api_key: str | None) -> str:
    """Where an RT-J's server is and how to ask it for predictions."""
    entity = metadata["entity"]
    auth = ' -H "Authorization: Bearer KEY"' if api_key else ""
    return "\n".join(
        [
            f"serving {metadata['model']} ({metadata['device']}); Ctrl-C stops",
            f"  HTTP:      {url}/predictions  (also /metadata, /stats, /healthz)",
            f"  task:      {metadata['task']} ({metadata['problem_type']}): "
            f"{metadata['target']['column']} of {entity['table']} rows, from {metadata['database']}",
            f"  rows:      by {entity['table']}.{entity['primary_key']}; time defaults to the "
            f"database's latest, {metadata['latest_time']}",
            "",
            f"curl {url}/predictions{auth} -H 'Content-Type: application/json' \\",
            f'  -d \'{{"rows": [{{"primary_key": "<{entity["primary_key"]}>", '
            f'"time": "{metadata["latest_time"]}"}}]}}\'',
        ]
    )
