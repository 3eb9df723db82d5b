"""`relay server` on a laptop with no servers: SQLite, a SQLite broker, the API and one worker; the SDK
finds it through the client file it writes, a job completes, a training session runs (its calls and
results through SQLite), and stopping it stops its worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx
import pytest

from tests.service.stack import free_port, wait_for

pytestmark = pytest.mark.slow


def processes_with_home(home: Path) -> list[int]:
    """Processes whose environment names this data directory (the server and its worker)."""
    marker = f"RELAY_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def start_relay_server(tmp_path: Path, home: Path, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], int]:
    """`relay server` on a free port with `home` as its data directory (no other RELAY_ setting),
    its output in `log`; the process and its port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["RELAY_HOME"] = str(home)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "relay.cli", "server", "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return server, port


def test_relay_server_runs_a_job_end_to_end(
    tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / ".relay"
    log = open(tmp_path / "server.out", "wb")  # noqa: SIM115
    server, port = start_relay_server(tmp_path, home, log)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert server.poll() is None, (tmp_path / "server.out").read_text()
            try:
                return httpx.get(f"{url}/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, 120, "relay server to answer", every=0.3)
        printed = (tmp_path / "server.out").read_text()
        assert f"Relay is serving at {url}" in printed and f"console: {url}/ " in printed
        assert (home / "relay.db").is_file() and (home / "client.json").is_file()
        # The key itself, the one the client file holds, so the console can be signed in to at once.
        key = json.loads((home / "client.json").read_text())["api_key"]
        assert f"API key for user 'local': {key}\n" in printed
        # A pi05 job in the server's first moments, whether or not its worker has beaten yet: this
        # machine has no GPU, and the server knows its worker trains on the CPU (it was accepted,
        # and its CPU worker then tried the 3 B model).
        early = httpx.post(
            f"{url}/v1/fine-tunes",
            json={"model": "pi05", "dataset_name": str(dataset), "batch_size": 2, "steps": 10},
            headers={"authorization": f"Bearer {key}"},
        )
        assert early.status_code == 400 and early.json()["error"]["param"] == "model", early.text
        assert "this service's workers train on their CPUs" in early.json()["error"]["message"]

        monkeypatch.delenv("RELAY_BASE_URL", raising=False)
        monkeypatch.delenv("RELAY_API_KEY", raising=False)
        monkeypatch.setenv("RELAY_HOME", str(home))
        from relay.sft.config import SFTConfig
        from relay.sft.train import train

        job = train(SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=10))
        job.wait(poll=1, timeout=300)
        assert job.status == "completed", job.error
        assert job.output_dir == str(home / "jobs" / job.id / "output")
        weights = job.download(tmp_path / "weights")
        assert (weights / "model.safetensors").stat().st_size > 0

        # The console at /, and /metrics on by default here (workers alive from their heartbeats).
        console = httpx.get(url + "/")
        assert console.status_code == 200 and "/console/js/app.js" in console.text
        metrics = httpx.get(url + "/metrics").text
        assert 'relay_fine_tunes{status="completed"} 1.0' in metrics
        # Both of its workers beat: the one for jobs and sessions, and the one for deployments (on a
        # loaded machine the second may start after the job is done).
        wait_for(
            lambda: "relay_workers_alive 2.0" in httpx.get(url + "/metrics").text,
            90,
            "both workers' heartbeats in /metrics",
            every=1,
        )

        refuses_what_its_worker_cannot_run(tmp_path, dataset)
        run_a_training_session(home)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        finally:
            log.close()
            leftovers = wait_for_exit(home)
            assert server.returncode is not None
            assert not leftovers, f"processes left running: {leftovers}"


def run_a_training_session(home: Path) -> None:
    import numpy as np

    from relay.training import ServiceClient, types
    from tests.service.sessions_data import batch

    with ServiceClient(progress=False).create_lora_training_client("pi05-tiny", rank=8) as training_client:
        futures = [
            training_client.forward_backward(batch(0, 2), "flow_matching"),
            training_client.optim_step(types.AdamParams(learning_rate=1e-4)),
            training_client.forward_backward(batch(2, 2), "flow_matching"),
        ]
        saved = training_client.save_state("embedded").result(timeout=120)
        actions = training_client.sample(batch(0, 1)[0].observation).result(timeout=120)
        assert [f.result().metrics["loss"] > 0 for f in futures[::2]] == [True, True]
        assert futures[1].result().metrics["skipped"] is False
    assert actions.shape == (10, 32) and np.isfinite(actions).all()
    # The client sees the state's address in its account; the state lies in the user's directory.
    assert saved.path == "relay://states/embedded"
    assert len(list(home.glob("users/*/states/embedded/session.json"))) == 1


def refuses_what_its_worker_cannot_run(tmp_path: Path, dataset: Path) -> None:
    """Its one worker trains on the CPU (alive, per the metrics above), and shares the API's disk."""
    from relay.errors import APIError
    from relay.sft.config import SFTConfig
    from relay.sft.train import train

    with pytest.raises(APIError) as too_big:
        train(SFTConfig(model="pi05", dataset_name=str(dataset), batch_size=2, steps=10))
    assert too_big.value.status == 400 and too_big.value.param == "model"
    assert "pi05 has 3.35 B weights" in str(too_big.value) and "RELAY_ALLOW_CPU_FULL_SIZE" in str(
        too_big.value
    )
    missing = tmp_path / "no-dataset-here"
    with pytest.raises(APIError) as not_there:
        train(SFTConfig(model="pi05-tiny", dataset_name=str(missing), batch_size=2, steps=10))
    assert not_there.value.status == 400 and not_there.value.param == "dataset_name"
    assert f"{missing} does not exist" in str(not_there.value)


def wait_for_exit(home: Path) -> list[int]:
    try:
        wait_for(lambda: not processes_with_home(home), 60, "the worker to stop", every=0.5)
    except AssertionError:
        leftovers = processes_with_home(home)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        return leftovers
    return []


def test_a_killed_relay_server_takes_its_workers_with_it(tmp_path: Path) -> None:
    """However the server ends (SIGKILL, a crash, a SIGTERM before its handler is set), its workers
    do not outlive it: a worker left behind would take the jobs of the next `relay server` with the
    same data directory, in a process nobody started."""
    home = tmp_path / ".relay"
    with open(tmp_path / "server.out", "wb") as log:
        server, _ = start_relay_server(tmp_path, home, log)
        try:
            # Both workers started: the server and its two workers hold the data directory.
            wait_for(lambda: len(processes_with_home(home)) >= 3, 120, "the server's two workers", every=0.3)
        finally:
            server.kill()
            server.wait(timeout=30)
    leftovers = wait_for_exit(home)
    assert not leftovers, f"processes left running after the server was killed: {leftovers}"
