"""A job with a validation split, end to end through the API, Redis and a real Celery worker on
pi05-tiny: its validation events after each checkpoint, the job's `validation` block in the API,
the job list, the SDK and `relay fine-tunes retrieve`; a bad split refused at create, and an
episode the dataset lacks refused once the worker reads the dataset."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay.events import CHUNKS_PER_FRAME, ValidationEvent
from relay.formatting import number_text
from relay.http_client import Client
from relay.sft import list_jobs
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.schemas import EventOut, FineTuneOut
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow


def tiny(dataset: Path, **fields: object) -> SFTConfig:
    defaults = {"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 2, "steps": 20}
    return SFTConfig(**{**defaults, **fields})


def test_a_job_with_a_validation_split_reports_its_scores_everywhere(
    stack: Stack, worker: WorkerProcess, client: Client, user: tuple[str, str], dataset: Path
) -> None:
    job = train(tiny(dataset, validation_episodes=[3]), client=client)
    assert job.validation_episodes == [3] and job.validation is None  # queued: nothing scored yet
    job.wait(poll=1, progress=False)
    assert job.status == "completed", job.error

    # After each checkpoint (every 10 steps here, and the last step), a validation event.
    events = job.events()
    order = [(e["step"], e.kind) for e in events if e.kind in ("checkpoint", "validation")]
    assert order == [(10, "checkpoint"), (10, "validation"), (20, "checkpoint"), (20, "validation")]
    scored = [e.typed for e in events if e.kind == "validation"]
    assert all(isinstance(e, ValidationEvent) for e in scored)
    assert all(e.episodes == 1 and 20 <= e.frames <= 30 for e in scored)  # episode 3: 20 to 30 frames
    assert scored[0].blind_mse == scored[1].blind_mse
    assert scored[0].mean_action_mse != scored[1].mean_action_mse
    assert all(e.chunks == CHUNKS_PER_FRAME and e.action_spread > 0 for e in scored)

    # As /openapi.json documents it: the raw answer's events and the job.
    headers = {"authorization": f"Bearer {user[1]}"}
    raw = httpx.get(f"{stack.api_url}/v1/fine-tunes/{job.id}/events", params={"limit": 100}, headers=headers)
    for event in raw.json()["data"]:
        EventOut.model_validate(event)
    answer = httpx.get(f"{stack.api_url}/v1/fine-tunes/{job.id}", headers=headers).json()
    FineTuneOut.model_validate(answer)

    # The block: the best scores (the lowest headline, the mean of the chunks' error, with its
    # step), the last, how many.
    best = min(scored, key=lambda e: e.mean_action_mse)
    block = answer["validation"]
    assert block["scored"] == 2
    assert block["last"] == {key: value for key, value in scored[-1].items() if key != "event"}
    assert block["best"]["step"] == best.step and block["best"]["mean_action_mse"] == best.mean_action_mse
    assert job.refresh().validation == block
    # The results card's slot is the same block (one definition of best and last).
    assert job.summary().model_dump(mode="json")["validation"] == block
    assert next(j for j in list_jobs(client=client) if j.id == job.id).validation == block

    # `relay fine-tunes retrieve`: a line for the best scores (and the last, when another step's).
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": user[1]}
    shown = CliRunner().invoke(app, ["fine-tunes", "retrieve", job.id], env=env)
    assert shown.exit_code == 0, shown.output
    headline = f"action error {number_text(best.mean_action_mse)} (mean of {CHUNKS_PER_FRAME} chunks)"
    assert f"best at step {best.step}: {headline}" in shown.output and " vs blind " in shown.output
    as_json = CliRunner().invoke(app, ["fine-tunes", "retrieve", job.id, "--json"], env=env)
    assert json.loads(as_json.output)["validation"] == block

    # A job without a split has no block.
    plain = train(tiny(dataset, steps=1), client=client).wait(poll=1, progress=False)
    assert plain.validation_episodes is None and plain.validation is None


def test_a_bad_split_is_refused_at_create_and_a_missing_episode_when_the_dataset_is_read(
    stack: Stack, worker: WorkerProcess, client: Client, user: tuple[str, str], dataset: Path
) -> None:
    headers = {"authorization": f"Bearer {user[1]}"}
    body = {"model": "pi05-tiny", "dataset_name": str(dataset), "steps": 5}
    for spec, why in (("9-3", "runs backwards"), (1.5, "more than 0 and less than 1"), ([2, 2], "twice")):
        answer = httpx.post(
            f"{stack.api_url}/v1/fine-tunes", json={**body, "validation_episodes": spec}, headers=headers
        )
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "validation_episodes" and why in error["message"]
        assert error["message"].startswith("bad validation_episodes: ")
    assert list_jobs(client=client) == []  # nothing was created

    # The dataset has episodes 0 to 3: the worker refuses episode 7 before any step.
    job = train(tiny(dataset, validation_episodes=[7]), client=client)
    with pytest.raises(RuntimeError):
        job.wait(poll=1, progress=False)
    assert job.status == "error"
    assert job.error == (
        "bad validation_episodes: [7] (the dataset has no episode 7; its episodes are 0 to 3)"
    )
    assert job.step == 0 and not [e for e in job.events() if e.kind == "metrics"]
