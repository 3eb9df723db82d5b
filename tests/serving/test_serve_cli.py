"""`relay serve`: loopback unless keyed, a job id read as its downloaded output, and the real
openpi-client talking to the served process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from typer.testing import CliRunner

from relay.cli import app
from relay_worker.serving.server import RunningPolicyServer

from .conftest import KEY, observation

runner = CliRunner()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5"])
def test_it_refuses_an_open_address_without_a_key(host: str) -> None:
    result = runner.invoke(app, ["serve", "pi05-tiny", "--host", host], env={"RELAY_SERVE_API_KEY": ""})
    assert result.exit_code == 2
    assert f"--host {host} is reachable from other machines: give --api-key KEY" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a GPU where there is none")
def test_a_gpu_that_is_not_there_is_one_sentence() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "relay.cli", "serve", "pi05-tiny", "--device", "cuda", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "bad device: cuda (no CUDA GPU is available to PyTorch here" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_relay_serve_and_relay_server_listen_on_different_ports_by_default() -> None:
    """Both on one machine (a robot's policy and the service the SDK reaches) without --port."""
    defaults = {}
    for command in ("serve", "server"):
        shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        defaults[command] = re.findall(r"--port\s.*?\[default: (\d+)\]", shown)
    assert defaults == {"serve": ["8001"], "server": ["8000"]}


@pytest.mark.slow
def test_relay_serve_answers_openpi_client_like_the_server(
    model_dir: Path, server: RunningPolicyServer, tmp_path: Path
) -> None:
    """`relay serve ft-...` serves the job's output downloaded into ./ft-... (as `relay fine-tunes
    download` leaves it), and gives the openpi client the chunk the in-test server gives for the
    same seed (another process, so within float32 rounding of another thread count: 1e-4)."""
    (tmp_path / "ft-0123456789ab").symlink_to(model_dir)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RELAY_SERVE_API_KEY": KEY}
    command = [
        sys.executable,
        "-m",
        "relay.cli",
        "serve",
        "ft-0123456789ab",
        "--port",
        "0",
        "--device",
        "cpu",
    ]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not lines or "policy.infer(" not in lines[-1]:
            lines.append(process.stdout.readline())
            assert lines[-1], f"relay serve ended before it served: {lines}"
        websocket = next(line.split()[1] for line in lines if line.strip().startswith("websocket:"))
        client = WebsocketClientPolicy(host=websocket.rstrip("/"), api_key=KEY)
        metadata = client.get_server_metadata()
        assert metadata["model"] == "ft-0123456789ab"
        # The printed snippet sends every camera the tuned model needs (it once sent only the first).
        infer = next(line for line in lines if "policy.infer(" in line)
        assert metadata["cameras_required"] and len(metadata["cameras"]) == 2
        assert all(f'"{camera}": ' in infer for camera in metadata["cameras"]), infer
        obs = {**observation(6), "seed": 99}
        served = client.infer(obs)["actions"]
        client._ws.close()
        here = WebsocketClientPolicy(host=server.url.removeprefix("http://"), api_key=KEY)
        expected = here.infer(obs)["actions"]
        here._ws.close()
        np.testing.assert_allclose(served, expected, rtol=0, atol=1e-4)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
