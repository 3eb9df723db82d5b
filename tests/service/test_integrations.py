"""A recipe's integrations through the API and a real worker: broken ones refused naming their
place (a key never echoed, never stored), the stored job keeping them, and a pi05-tiny job with
TensorBoard whose event files are among the job's files, downloaded and read back with
TensorBoard's own reader."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from relay.http_client import Client
from relay.sft.train import train
from tests.engine.training.test_mlflow_tracker import mlflow_server  # noqa: F401 (a fixture)
from tests.service.stack import Stack, WorkerProcess
from tests.service.test_api import GOOD, count_jobs
from tests.service.test_jobs import tiny

pytestmark = pytest.mark.slow

SECRET = "not-a-real-key-" + "7" * 25


@pytest.mark.parametrize(
    ("integrations", "param", "message"),
    [
        (
            [{"type": "wandb", "wandb": {"project": "a/b"}}],
            "integrations[0].wandb.project",
            'bad integrations[0].wandb.project: "a/b" (must be a W&B project name',
        ),
        (
            [{"type": "tensorboard"}, {"type": "wandb", "wandb": {"entity": "team"}}],
            "integrations[1].wandb.project",
            "missing integrations[1].wandb.project (required",
        ),
        (
            [{"type": "wandb", "wandb": {"project": "p", "tags": ["x" * 65]}}],
            "integrations[0].wandb.tags",
            "bad integrations[0].wandb.tags:",
        ),
        (
            [{"type": "mlflow", "mlflow": {"tracking_uri": "ftp://127.0.0.1:5000", "experiment": "e"}}],
            "integrations[0].mlflow.tracking_uri",
            'bad integrations[0].mlflow.tracking_uri: "ftp://127.0.0.1:5000" (must be the tracking',
        ),
        (
            [{"type": "tensorboard"}, {"type": "tensorboard"}],
            "integrations",
            "bad integrations: tensorboard is named 2 times",
        ),
        (
            [{"type": "wandb", "wandb": {"project": "p", "token": SECRET}}],
            "integrations[0].wandb.token",
            "bad integrations[0].wandb.token: not taken (a W&B key goes in wandb.api_key",
        ),
        (
            [{"type": "wandb", "wandb": {"project": "p", "api_key": SECRET + " x"}}],
            "integrations[0].wandb.api_key",
            "bad integrations[0].wandb.api_key: not shown (must be text of 1 to 512 characters",
        ),
        (
            [{"type": "mlflow", "mlflow": {"tracking_uri": "https://m.example", "password": SECRET}}],
            "integrations[0].mlflow.password",
            "bad integrations[0].mlflow.password: not taken",
        ),
    ],
)
def test_broken_integrations_are_refused_naming_their_place(
    parked: TestClient,
    alice: dict[str, str],
    stack: Stack,
    integrations: list[dict[str, Any]],
    param: str,
    message: str,
) -> None:
    before = count_jobs(stack)
    response = parked.post("/v1/fine-tunes", json={**GOOD, "integrations": integrations}, headers=alice)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"].startswith(message), error["message"]
    assert SECRET not in response.text
    assert count_jobs(stack) == before


def test_a_job_keeps_its_integrations(parked: TestClient, alice: dict[str, str]) -> None:
    given = [{"type": "wandb", "wandb": {"project": "pick", "tags": ["a"]}}, {"type": "tensorboard"}]
    created = parked.post("/v1/fine-tunes", json={**GOOD, "integrations": given}, headers=alice)
    assert created.status_code == 200, created.text
    shown = [{"type": "wandb", "wandb": {"project": "pick", "entity": None, "name": None, "tags": ["a"]}}]
    shown.append({"type": "tensorboard"})
    assert created.json()["integrations"] == shown
    again = parked.get(f"/v1/fine-tunes/{created.json()['id']}", headers=alice)
    assert again.json()["integrations"] == shown
    # A job that names none shows an empty list.
    plain = parked.post("/v1/fine-tunes", json=GOOD, headers=alice)
    assert plain.json()["integrations"] == []


def test_a_tensorboard_jobs_event_files_are_among_its_files(
    stack: Stack, worker: WorkerProcess, client: Client, dataset: Path, tmp_path: Path
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job = train(tiny(dataset, steps=10, integrations=[{"type": "tensorboard"}]), client=client)
    job.wait(poll=1)
    assert job.status == "completed", job.error
    events = job.events()
    assert not [e for e in events if e.kind == "tracker"]
    (metrics,) = [e for e in events if e.kind == "metrics"]

    files = [f for f in job.files(checkpoints=True) if f["path"].startswith("tensorboard/")]
    assert files and all(f["path"].split("/")[-1].startswith("events.out.tfevents.") for f in files)
    target = job.download(tmp_path / "job", checkpoints=True)
    reader = EventAccumulator(str(target / "tensorboard"), size_guidance={"scalars": 0})
    reader.Reload()
    (loss,) = reader.Scalars("train/loss")
    assert loss.step == 10 and loss.value == pytest.approx(metrics["loss"], rel=1e-5)
    assert [s.step for s in reader.Scalars("checkpoint/seconds")] == [10]


def test_relay_fine_tunes_create_takes_integrations(
    stack: Stack, user: tuple[str, str], tmp_path: Path
) -> None:
    import json

    from typer.testing import CliRunner

    from relay.cli import app

    env = {"RELAY_BASE_URL": stack.parked_api_url, "RELAY_API_KEY": user[1], "RELAY_HOME": str(tmp_path)}
    base = ["fine-tunes", "create", "--model", "pi05-tiny", "--dataset", "lerobot/pusht_image", "--json"]
    wandb = '{"type": "wandb", "wandb": {"project": "pick", "entity": "team"}}'
    made = CliRunner().invoke(app, [*base, "--integration", "tensorboard", "--integration", wandb], env=env)
    assert made.exit_code == 0, made.output
    assert json.loads(made.output)["integrations"] == [
        {"type": "tensorboard"},
        {"type": "wandb", "wandb": {"project": "pick", "entity": "team", "name": None, "tags": []}},
    ]
    short = CliRunner().invoke(app, [*base, "--wandb-project", "pick"], env=env)
    assert short.exit_code == 0 and json.loads(short.output)["integrations"][0]["wandb"]["project"] == "pick"
    refused = CliRunner().invoke(app, [*base, "--wandb-project", "a/b"], env=env)
    assert refused.exit_code == 2 and 'bad integrations[0].wandb.project: "a/b"' in refused.output


def test_the_console_form_takes_integrations_and_the_job_page_shows_them(
    browser: Any, stack: Stack, user: tuple[str, str]
) -> None:
    from playwright.sync_api import expect

    from tests.service.browser import fenced_page, sign_in

    origin = stack.parked_api_url
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    page.goto(f"{origin}/#/new")
    page.select_option("#field-model", "pi05-tiny")
    page.fill("#field-dataset_name", "lerobot/pusht_image")
    page.fill("#field-steps", "20")
    page.fill(
        "#field-integrations", '[{"type": "tensorboard"}, {"type": "wandb", "wandb": {"project": "a/b"}}]'
    )
    page.click("button:has-text('Start fine-tune')")
    expect(page.locator("[data-error-for=integrations]")).to_contain_text(
        'bad integrations[1].wandb.project: "a/b"'
    )
    wandb = '{"type": "wandb", "wandb": {"project": "pick", "entity": "team", "tags": ["a"]}}'
    fixed = f'[{{"type": "tensorboard"}}, {wandb}]'
    page.fill("#field-integrations", fixed)
    page.click("button:has-text('Start fine-tune')")
    expect(page.locator("dd[data-config=integrations]")).to_have_text(
        "tensorboard: event files under tensorboard/ among the files; wandb: team/pick (tags a)"
    )
    assert fence.refused == []


def test_keys_given_at_create_are_held_apart_from_the_job(
    parked: TestClient, alice: dict[str, str], stack: Stack
) -> None:
    """A W&B key and an MLflow token given at create: the answer and the stored job never hold them;
    they wait in their own row, by the environment variable each stands for."""
    from sqlalchemy import select

    from relay_api.models import fine_tunes, tracker_credentials

    key, token = "wandbkey-" + "9" * 31, "mlflowtoken-" + "3" * 28
    integrations = [
        {"type": "wandb", "wandb": {"project": "keys", "api_key": key}},
        {"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example", "token": token}},
    ]
    created = parked.post("/v1/fine-tunes", json={**GOOD, "integrations": integrations}, headers=alice)
    assert created.status_code == 200, created.text
    job = created.json()
    again = parked.get(f"/v1/fine-tunes/{job['id']}", headers=alice)
    for answer in (created.text, again.text):
        assert key not in answer and token not in answer
    assert "api_key" not in again.json()["integrations"][0]["wandb"]
    assert "token" not in again.json()["integrations"][1]["mlflow"]
    with stack.sessions() as session:
        held = session.execute(
            select(tracker_credentials.c.secrets).where(tracker_credentials.c.job_id == job["id"])
        ).scalar_one()
        stored = session.execute(select(fine_tunes.c.config).where(fine_tunes.c.id == job["id"])).scalar_one()
    assert held == {"WANDB_API_KEY": key, "MLFLOW_TRACKING_TOKEN": token}
    assert key not in json.dumps(stored) and token not in json.dumps(stored)
    # A job that names no key holds none.
    plain = parked.post("/v1/fine-tunes", json=GOOD, headers=alice).json()
    with stack.sessions() as session:
        assert (
            session.execute(
                select(tracker_credentials.c.job_id).where(tracker_credentials.c.job_id == plain["id"])
            ).first()
            is None
        )


def test_a_token_given_at_create_reaches_the_tracker_and_is_forgotten_after(
    stack: Stack,
    worker: WorkerProcess,
    client: Client,
    dataset: Path,
    mlflow_server: str,  # noqa: F811 (the fixture imported above)
) -> None:
    """The worker hands the held token to the job's MLflow tracker: a recording proxy in front of a
    real mlflow server sees it as every request's bearer; no event holds it, and the reconciler
    deletes it once the job has ended."""
    from sqlalchemy import select

    from relay_api.models import tracker_credentials
    from tests.recording_proxy import RecordingProxy

    token = "mlflowtoken-" + "5" * 28
    with RecordingProxy(mlflow_server) as proxy:
        mlflow = {"tracking_uri": proxy.url, "experiment": "keys", "token": token}
        job = train(
            tiny(dataset, steps=4, integrations=[{"type": "mlflow", "mlflow": mlflow}]), client=client
        )
        job.wait(poll=1)
        assert job.status == "completed", job.error
        assert proxy.authorizations and set(proxy.authorizations) == {f"Bearer {token}"}
    events = job.events()
    assert not [e for e in events if e.kind == "tracker"], events
    assert token not in json.dumps([dict(e) for e in events])
    deadline = time.monotonic() + 60
    while True:
        with stack.sessions() as session:
            left = session.execute(
                select(tracker_credentials.c.job_id).where(tracker_credentials.c.job_id == job.id)
            ).first()
        if left is None:
            break
        assert time.monotonic() < deadline, "the ended job's token was still held after 60 s"
        time.sleep(1)
