"""from_checkpoint through the service: a job started from a completed job's output records its
parent; what the API can tell at create (a job id that is not a completed job of the caller's, a
missing directory, another architecture) is a 400 naming from_checkpoint; a Hub repo that is not
there fails the job once, without retries."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.job import FineTuneJob
from relay.sft.train import train
from relay_api.app import create_app
from tests.hub import FakeHub
from tests.service.stack import PARKED_QUEUE, ApiServer, Stack, WorkerProcess

pytestmark = pytest.mark.slow


def tiny(dataset: Path, **fields: object) -> SFTConfig:
    return SFTConfig(
        **{"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 2, "steps": 2, **fields}
    )


@pytest.fixture(scope="module")
def parent(stack: Stack, dataset: Path) -> Iterator[tuple[FineTuneJob, Client]]:
    """A completed job of one user, and that user's client."""
    stack.worker()
    client = Client(stack.api_url, stack.new_user()[1], max_retries=0)
    job = train(tiny(dataset), client=client)
    job.wait(poll=0.5)
    assert job.status == "completed", job.error
    yield job, client
    client.close()


def create(stack: Stack, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{stack.api_url}/v1/fine-tunes", json=body, headers={"authorization": f"Bearer {token}"}, timeout=30
    )


def test_a_job_from_a_job_id_completes_and_records_its_parent(
    parent: tuple[FineTuneJob, Client], dataset: Path
) -> None:
    job, client = parent
    child = train(tiny(dataset, from_checkpoint=job.id), client=client)
    assert child.from_checkpoint == job.id and child.weights is None  # nothing loaded yet
    child.wait(poll=0.5)
    assert child.status == "completed", child.error
    recorded = {
        "model": "pi05-tiny",
        "repo": None,
        "revision": None,
        "sha": None,
        "path": None,  # the output lies on the service: the job id says where
        "job": job.id,
    }
    assert child.refresh().to_dict()["weights"] == recorded  # GET /v1/fine-tunes/{id}
    assert child.summary().weights is not None
    assert child.summary().weights.model_dump() == recorded  # the results card
    assert child.attempts == 1
    # What was loaded is the job's, not one of its training's events.
    assert not [event for event in child.events() if event.kind == "weights"]


def test_the_api_refuses_a_job_id_it_cannot_start_from(
    stack: Stack, parent: tuple[FineTuneJob, Client], dataset: Path
) -> None:
    job, _ = parent
    stranger = stack.new_user()[1]
    body = {"model": "pi05-tiny", "dataset_name": str(dataset), "steps": 2}
    for value, why in (
        ("ft-000000000000", "no fine-tune of yours has this id"),
        (job.id, "no fine-tune of yours has this id"),  # another user's job is as absent
    ):
        answer = create(stack, stranger, {**body, "from_checkpoint": value})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "from_checkpoint"
        assert error["message"] == f'bad from_checkpoint: "{value}" ({why})'


def test_a_job_that_is_not_completed_is_refused(stack: Stack, dataset: Path) -> None:
    settings = stack.settings.model_copy(update={"fine_tune_queue": PARKED_QUEUE})
    token = stack.new_user()[1]
    headers = {"authorization": f"Bearer {token}"}
    with TestClient(create_app(settings)) as api:
        queued = api.post(
            "/v1/fine-tunes", json={"model": "pi05-tiny", "dataset_name": str(dataset)}, headers=headers
        ).json()
        answer = api.post(
            "/v1/fine-tunes",
            json={"model": "pi05-tiny", "dataset_name": str(dataset), "from_checkpoint": queued["id"]},
            headers=headers,
        )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        f'bad from_checkpoint: "{queued["id"]}" (that fine-tune is queued; training starts from '
        "a completed job's weights)"
    )


def test_another_architecture_is_refused_naming_both(
    stack: Stack, parent: tuple[FineTuneJob, Client], dataset: Path, tmp_path: Path
) -> None:
    job, client = parent
    token = client.api_key
    assert token is not None
    answer = create(stack, token, {"model": "pi05", "dataset_name": str(dataset), "from_checkpoint": job.id})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "from_checkpoint"
    assert answer.json()["error"]["message"].startswith(
        f'bad from_checkpoint: "{job.id}" holds pi05-tiny weights, and model is "pi05"'
    )
    # A directory, where the API shares the workers' disk: its config is read; a missing one refused.
    settings = stack.settings.model_copy(
        update={"fine_tune_queue": PARKED_QUEUE, "api_shares_workers_disk": True}
    )
    headers = {"authorization": f"Bearer {token}"}
    with TestClient(create_app(settings)) as api:
        body = {"model": "pi05", "dataset_name": str(dataset), "from_checkpoint": job.output_dir}
        mismatch = api.post("/v1/fine-tunes", json=body, headers=headers)
        missing = api.post(
            "/v1/fine-tunes",
            json={**body, "model": "pi05-tiny", "from_checkpoint": str(tmp_path / "nowhere")},
            headers=headers,
        )
        fits = api.post("/v1/fine-tunes", json={**body, "model": "pi05-tiny"}, headers=headers)
    assert mismatch.status_code == 400
    assert 'holds pi05-tiny weights, and model is "pi05"' in mismatch.json()["error"]["message"]
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == (
        f'bad from_checkpoint: "{tmp_path / "nowhere"}" ({tmp_path / "nowhere"} is not a directory on '
        "the workers' disk)"
    )
    assert fits.status_code == 200, fits.text
    assert fits.json()["from_checkpoint"] == job.output_dir


def test_a_missing_hub_revision_fails_the_job_once(stack: Stack, dataset: Path) -> None:
    queue = f"fine-tunes-hub-{uuid.uuid4().hex[:6]}"
    with FakeHub() as hub:
        endpoint = hub.endpoint
        api = ApiServer(
            stack.settings.model_copy(update={"fine_tune_queue": queue, "session_queue": queue + "-s"})
        )
        env = {
            **os.environ,
            **stack.env_settings,
            "RELAY_FINE_TUNE_QUEUE": queue,
            "RELAY_SESSION_QUEUE": queue + "-s",
            "HF_ENDPOINT": hub.endpoint,
        }
        worker = WorkerProcess(env, stack.root / f"worker-{queue}.log")
        worker.start()
        client = Client(api.url, stack.new_user()[1], max_retries=0)
        try:
            worker.wait_ready()
            job = train(tiny(dataset, from_checkpoint="team/missing@v2"), client=client)
            with pytest.raises(RuntimeError, match="failed: bad from_checkpoint"):
                job.wait(poll=0.5)
        finally:
            client.close()
            worker.stop()
            api.stop()
    assert job.status == "error"
    assert job.attempts == 1  # a user's mistake: no retries
    assert job.error is not None
    assert job.error == (
        "bad from_checkpoint: cannot get model.safetensors of team/missing at revision v2 from "
        f"{endpoint} (RepositoryNotFoundError: no model repo team/missing there (a private one needs "
        "HF_TOKEN)); download it once, or pass the path of a local directory holding it"
    )


def test_relay_fine_tunes_create_sends_from_checkpoint(
    stack: Stack, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from relay.cli import app

    (tmp_path / "my-pi05").mkdir()
    monkeypatch.chdir(tmp_path)
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": stack.new_user()[1], "RELAY_HOME": str(tmp_path)}
    common = [
        "fine-tunes",
        "create",
        "--model",
        "pi05-tiny",
        "--dataset",
        str(dataset),
        "--steps",
        "1",
        "--json",
    ]
    runner = CliRunner()
    # A directory given relative is sent as its absolute path; a Hub repo at a revision as it is.
    for given, sent in (("my-pi05", str(tmp_path / "my-pi05")), ("team/my-pi05@v2", "team/my-pi05@v2")):
        created = runner.invoke(
            app, [*common, "--from-checkpoint", given, "--normalization", "checkpoint"], env=env
        )
        assert created.exit_code == 0, created.output
        job = json.loads(created.output)
        assert (job["from_checkpoint"], job["normalization"]) == (sent, "checkpoint")
        runner.invoke(app, ["fine-tunes", "cancel", job["id"]], env=env)
    refused = runner.invoke(app, [*common, "--from-checkpoint", "ft-000000000000"], env=env)
    assert refused.exit_code != 0
    assert 'bad from_checkpoint: "ft-000000000000" (no fine-tune of yours has this id)' in refused.output


def test_a_training_session_starts_from_a_completed_jobs_weights(
    stack: Stack, parent: tuple[FineTuneJob, Client]
) -> None:
    """A session's from_checkpoint, as a job's: a completed fine-tune of the caller's (its output, which
    the worker finds), said in the session's info; another user's job is a 400 naming the field."""
    from relay.training import ServiceClient

    job, client = parent
    service = ServiceClient(stack.api_url, client.api_key)
    with service.create_lora_training_client("pi05-tiny", rank=4, from_checkpoint=job.id) as training:
        listed = next(s for s in service.list_sessions() if s["id"] == training.id)
        assert listed["from_checkpoint"] == job.id
        assert listed["info"]["weights"] == f"pi05-tiny weights of fine-tune {job.id}", listed
    stranger = stack.new_user()[1]
    refused = httpx.post(
        f"{stack.api_url}/v1/sessions",
        json={"base_model": "pi05-tiny", "from_checkpoint": job.id},
        headers={"authorization": f"Bearer {stranger}"},
        timeout=30,
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "from_checkpoint"
    assert "no fine-tune of yours has this id" in refused.json()["error"]["message"]
    rtj = httpx.post(
        f"{stack.api_url}/v1/sessions",
        json={"base_model": "rt-j-tiny", "from_checkpoint": job.id},
        headers={"authorization": f"Bearer {client.api_key}"},
        timeout=30,
    )
    assert rtj.status_code == 400 and rtj.json()["error"]["param"] == "from_checkpoint"
