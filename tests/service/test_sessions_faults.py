"""Training sessions when things go wrong: no worker takes one, its client goes silent, its worker
is killed. The stack's sessions idle out after 4 s and leases last 3 s, so each shows in seconds."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from relay.errors import RequestFailedError
from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay.training import ServiceClient, types
from tests.service.sessions_data import batch
from tests.service.stack import Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


def session_row(stack: Stack, key: str, session_id: str) -> dict:
    answer = httpx.get(
        f"{stack.api_url}/v1/sessions/{session_id}", headers={"authorization": f"Bearer {key}"}
    )
    answer.raise_for_status()
    return dict(answer.json())


def test_a_session_no_worker_takes_times_out_with_a_clear_error_and_is_ended(
    stack: Stack, user: tuple[str, str]
) -> None:
    service = ServiceClient(stack.parked_api_url, user[1], start_timeout=1.0, progress=False)
    with pytest.raises(
        TimeoutError, match=r"no worker took session ses-[0-9a-f]{12} within 1 s: every worker is busy"
    ):
        service.create_lora_training_client("pi05-tiny")
    listed = httpx.get(f"{stack.api_url}/v1/sessions", headers={"authorization": f"Bearer {user[1]}"}).json()
    assert [(s["status"], s["error"]) for s in listed["data"]] == [
        ("closed", "closed by its client before it was ready")
    ]
    service.close()


def test_a_session_waiting_for_the_only_worker_names_the_job_that_holds_it(
    stack: Stack,
    user: tuple[str, str],
    worker: WorkerProcess,
    dataset: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = Client(stack.api_url, user[1])
    job = train(
        SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=100_000), client=client
    )
    try:
        wait_for(lambda: job.refresh().status == "running", 120, "the job to hold the worker")
        service = ServiceClient(stack.api_url, user[1], start_timeout=3.0)
        with pytest.raises(
            TimeoutError, match=rf"none is running; held by your fine-tune {job.id} \(running, step"
        ):
            service.create_lora_training_client("pi05-tiny")
        service.close()
        # stderr is no terminal here: the wait said it in a line too.
        assert (
            f"waiting for a free worker; held by your fine-tune {job.id} (running" in capsys.readouterr().err
        )
    finally:
        job.cancel()


def test_a_silent_client_loses_its_session_and_a_heartbeating_one_keeps_it(
    stack: Stack, user: tuple[str, str], worker: WorkerProcess
) -> None:
    idle = float(stack.env_settings["RELAY_SESSION_IDLE_SECONDS"])
    headers = {"authorization": f"Bearer {user[1]}"}
    # A client that starts a session and goes away without a word (no SDK, so no heartbeats).
    created = httpx.post(
        f"{stack.api_url}/v1/sessions", headers=headers, json={"base_model": "pi05-tiny"}
    ).json()
    wait_for(
        lambda: session_row(stack, user[1], created["id"])["status"] != "starting", 60, "the session to load"
    )
    ended = wait_for(
        lambda: (row := session_row(stack, user[1], created["id"]))["status"] != "ready" and row,
        idle + 15,
        "the idle session to be closed",
        every=0.2,
    )
    assert ended["status"] == "closed"
    assert ended["error"] == f"no contact from its client for {idle:.0f} s; what was not saved is lost"

    # The worker is free again; the SDK's heartbeats keep a quiet session open past the idle timeout.
    service = ServiceClient(stack.api_url, user[1], progress=False)
    with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
        time.sleep(idle + 1.5)
        assert training_client.forward(batch(0, 1)).result(timeout=30)["velocity"].shape[0] == 1
    # Closed by its client, as a session should end: no error to show.
    closed = wait_for(
        lambda: (row := session_row(stack, user[1], training_client.id))["status"] == "closed" and row,
        30,
        "the session to close",
        every=0.2,
    )
    assert closed["error"] is None
    service.close()


def test_a_killed_worker_ends_its_session_with_a_clear_error(stack: Stack, user: tuple[str, str]) -> None:
    worker = stack.worker()
    service = ServiceClient(stack.api_url, user[1], progress=False)
    training_client = service.create_lora_training_client("pi05-tiny", rank=8)
    training_client.forward_backward(batch(0, 2), "flow_matching").result(timeout=60)
    worker.kill()  # SIGKILL: the worker and its pool process at once
    started = time.monotonic()
    pending = training_client.optim_step(types.AdamParams(learning_rate=1e-4))
    with pytest.raises(RequestFailedError) as error:
        pending.result(timeout=60)
    assert error.value.category == "server" and error.value.code == "worker_lost"
    assert "its worker stopped responding (killed or lost)" in str(error.value)
    assert time.monotonic() - started < 15  # a lease (3 s here) and a look, not a hang
    row = session_row(stack, user[1], training_client.id)
    assert row["status"] == "error" and "stopped responding" in row["error"]
    with pytest.raises(RequestFailedError, match="stopped responding"):
        training_client.forward(batch(0, 1)).result(timeout=30)
    training_client.close()
    service.close()


def test_a_worker_that_shuts_down_ends_its_session_saying_so(stack: Stack, user: tuple[str, str]) -> None:
    """A warm shutdown (SIGTERM, as `docker compose stop` sends) does not wait for a session, which may
    be open for hours: the worker ends it at once, and the client hears why."""
    worker = stack.worker()
    service = ServiceClient(stack.api_url, user[1], progress=False)
    training_client = service.create_lora_training_client("pi05-tiny", rank=8)
    training_client.forward(batch(0, 1)).result(timeout=60)
    assert worker.shut_down(timeout=60) == 0
    row = session_row(stack, user[1], training_client.id)
    assert row["status"] == "error" and row["error"] == "its worker shut down; what was not saved is lost"
    with pytest.raises(RequestFailedError, match="its worker shut down") as error:
        training_client.forward(batch(0, 1)).result(timeout=30)
    assert error.value.category == "server"
    training_client.close()
    service.close()
