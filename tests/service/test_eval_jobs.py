"""A job with an `eval` block, end to end through the API, Redis and a real Celery worker on
pi05-tiny and a synthetic dataset: the policy run in relay/Dot-v0 at each checkpoint and at the
end, as `eval` events, the job's files (each report and its videos), the results card's `eval`
slot and `relay fine-tunes eval`; a bad block refused at create, naming its field."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay.env_evaluation import EnvEvalReport
from relay.events import EvalEvent, eval_report_path
from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.schemas import EventOut, FineTuneOut
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow

EVAL = {"env": "relay/Dot-v0", "episodes": 2, "max_steps": 10, "at_checkpoints": True}


def test_a_job_with_an_eval_block_reports_its_evaluations_everywhere(
    stack: Stack, worker: WorkerProcess, client: Client, user: tuple[str, str], dataset: Path
) -> None:
    config = SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=20, eval=EVAL)
    job = train(config, client=client)
    assert job.eval is not None and job.eval["env"] == "relay/Dot-v0" and job.eval["videos"] == 2
    job.wait(poll=1, progress=False)
    assert job.status == "completed", job.error

    # After each checkpoint (every 10 steps here, the last one too), an eval event; none twice.
    events = job.events()
    order = [(e["step"], e.kind) for e in events if e.kind in ("checkpoint", "eval")]
    assert order == [(10, "checkpoint"), (10, "eval"), (20, "checkpoint"), (20, "eval")]
    evaluations = job.evaluations()
    assert [e.step for e in evaluations] == [10, 20]
    for evaluation in evaluations:
        assert isinstance(evaluation, EvalEvent) and evaluation.env == "relay/Dot-v0"
        assert evaluation.episodes == 2 and 0 <= evaluation.success_rate <= 1
        assert 1 <= evaluation.mean_length <= 10  # max_steps
        assert evaluation.videos == [
            f"eval/step-{evaluation.step:08d}/episode_0000.mp4",
            f"eval/step-{evaluation.step:08d}/episode_0001.mp4",
        ]

    # As /openapi.json documents them.
    headers = {"authorization": f"Bearer {user[1]}"}
    raw = httpx.get(f"{stack.api_url}/v1/fine-tunes/{job.id}/events", params={"limit": 100}, headers=headers)
    for event in raw.json()["data"]:
        EventOut.model_validate(event)
    FineTuneOut.model_validate(httpx.get(f"{stack.api_url}/v1/fine-tunes/{job.id}", headers=headers).json())

    # The job's files: each report, whole, and its videos (H.264 mp4s, served as video/mp4).
    listed = {
        f["path"]
        for f in httpx.get(f"{stack.api_url}/v1/fine-tunes/{job.id}/files", headers=headers).json()["data"]
    }
    last = evaluations[-1]
    assert {eval_report_path(10), eval_report_path(20), *last.videos} <= listed
    answer = httpx.get(
        f"{stack.api_url}/v1/fine-tunes/{job.id}/files/{eval_report_path(20)}", headers=headers
    )
    report = EnvEvalReport.model_validate_json(answer.content)
    assert report.success_rate == last.success_rate and len(report.episodes) == 2
    assert [r.video for r in report.episodes] == last.videos
    video = httpx.get(f"{stack.api_url}/v1/fine-tunes/{job.id}/files/{last.videos[0]}", headers=headers)
    assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
    assert video.content[4:8] == b"ftyp"
    missing = httpx.get(
        f"{stack.api_url}/v1/fine-tunes/{job.id}/files/eval/step-00000030.json", headers=headers
    )
    assert missing.status_code == 404

    # The results card: the best and the last, and each checkpoint's own.
    card = job.summary()
    assert card.eval is not None and card.eval.evaluated == 2
    assert card.eval.last.step == 20 and card.eval.last.success_rate == last.success_rate
    assert [c.eval.success_rate if c.eval else None for c in card.checkpoints] == [
        e.success_rate for e in evaluations
    ]

    # `relay fine-tunes eval`: a row per evaluation, or JSON.
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": user[1]}
    shown = CliRunner().invoke(app, ["fine-tunes", "eval", job.id], env=env)
    assert shown.exit_code == 0, shown.output
    assert "relay/Dot-v0" in shown.output and eval_report_path(20) in shown.output
    assert f"{last.success_rate:.0%}" in shown.output
    as_json = CliRunner().invoke(app, ["fine-tunes", "eval", job.id, "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.output)
    assert [row["step"] for row in rows] == [10, 20] and rows[1]["report"] == eval_report_path(20)


def test_a_bad_eval_block_is_refused_at_create_naming_its_field(
    stack: Stack, user: tuple[str, str], dataset: Path
) -> None:
    headers = {"authorization": f"Bearer {user[1]}"}
    body = {"model": "pi05-tiny", "dataset_name": str(dataset), "steps": 2}
    cases = [
        ({"env": "CartPole-v1"}, "eval.env", "must be one of the environments a worker runs"),
        ({"env": "relay/Dot-v0", "episodes": 0}, "eval.episodes", "from 1 to 1000"),
        ({"env": "relay/Dot-v0", "colour": "red"}, "eval.colour", "unknown field colour"),
        ({"episodes": 3}, "eval.env", "missing eval.env"),
    ]
    for block, param, why in cases:
        answer = httpx.post(f"{stack.api_url}/v1/fine-tunes", json={**body, "eval": block}, headers=headers)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == param and why in error["message"], error


def test_an_eval_block_over_its_budget_is_refused_alike_by_the_sdk_the_cli_and_the_api(
    stack: Stack, user: tuple[str, str], dataset: Path, tmp_path: Path
) -> None:
    from relay.errors import ConfigError

    headers = {"authorization": f"Bearer {user[1]}"}
    probe = {"env": "relay/Dot-v0", "episodes": 1000, "max_steps": 100_000}
    body = {"model": "pi05-tiny", "dataset_name": str(dataset), "steps": 2, "eval": probe}
    answer = httpx.post(f"{stack.api_url}/v1/fine-tunes", json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "eval.episodes" and "at most 100,000 episode-steps" in error["message"]
    with pytest.raises(ConfigError) as raised:
        SFTConfig(**body)
    assert raised.value.message == error["message"]
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(body))
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": user[1], "RELAY_HOME": str(tmp_path)}
    created = CliRunner().invoke(app, ["fine-tunes", "create", "--config", str(recipe)], env=env)
    assert created.exit_code != 0 and "at most 100,000 episode-steps" in created.output, created.output

    # Summed over the evaluations at each checkpoint, at the cadence this service checkpoints at
    # (every 10 steps here): 21 evaluations of 50,000, where the default cadence would make 1.
    block = {"env": "relay/Dot-v0", "episodes": 1000, "at_checkpoints": True}
    body = {"model": "pi05-tiny", "dataset_name": str(dataset), "steps": 201, "eval": block}
    assert SFTConfig(**body).eval is not None
    assert stack.settings.checkpoint_every == 10
    answer = httpx.post(f"{stack.api_url}/v1/fine-tunes", json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "eval.at_checkpoints" and "evaluates 21 times" in error["message"], error
    assert httpx.get(f"{stack.api_url}/v1/fine-tunes", headers=headers).json()["data"] == []


def test_a_cancel_stops_the_jobs_evaluation_within_seconds(
    stack: Stack, worker: WorkerProcess, client: Client, dataset: Path
) -> None:
    """1,000 episodes of up to 100 steps, within the budget, take hours on a CPU: a cancel during
    the evaluation of the end ends the job cancelled, at its step, with no eval event."""
    from tests.service.stack import wait_for

    block = {"env": "relay/Dot-v0", "episodes": 1000, "max_steps": 100, "videos": 0}
    config = SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=2, eval=block)
    job = train(config, client=client)
    # The last checkpoint's event comes before the evaluation of the end: it is running now.
    wait_for(
        lambda: any(e.kind == "checkpoint" and e["step"] == 2 for e in job.events()),
        300,
        "the job's last checkpoint",
        every=0.5,
    )
    assert job.refresh().status == "running"
    job.cancel()
    wait_for(lambda: job.refresh().status == "cancelled", 120, "the cancel to stop the evaluation", every=0.5)
    assert job.step == 2 and not [e for e in job.events() if e.kind == "eval"]
