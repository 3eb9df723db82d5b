"""A recipe on a mixture of datasets through the service: a broken mixture refused at create naming
its place (nothing stored), and a pi05-tiny job on a v2.1 image dataset mixed with a v3.0 video
dataset of other camera names, made through the SDK, plain HTTP and the CLI, that trains on a real
worker and reports what it read of each dataset, each one's share, and each one's validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from relay.events import validation_line
from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from tests.service.stack import Stack, WorkerProcess
from tests.service.test_api import count_jobs

pytestmark = pytest.mark.slow

OVERHEAD = {"observation.images.overhead": (32, 32)}


@pytest.fixture(scope="module")
def overhead_video(stack: Stack) -> Path:
    """A LeRobot v3.0 dataset whose one camera, stored as H.264 video, has a name the other lacks."""
    return stack.dataset(
        "mix-overhead-video", episodes=4, episode_length=(8, 12), cameras=OVERHEAD, format="v3.0", video=True
    )


def mixture(image: Path, video: Path) -> list[dict[str, Any]]:
    return [
        {"name": str(image), "weight": 3},
        {"name": str(video), "cameras": {"base_0_rgb": "observation.images.overhead"}},
    ]


@pytest.mark.parametrize(
    ("datasets", "extra", "param", "message"),
    [
        (
            [{"name": "lerobot/a"}, {"name": "lerobot/b", "weight": 0}],
            {},
            "datasets[1].weight",
            "bad datasets[1].weight: 0",
        ),
        ([{"name": "lerobot/a"}], {}, "datasets", "bad datasets: a list of 1 (must be a list of 2 to 16"),
        (
            [{"name": "lerobot/a"}, {"name": "lerobot/a"}],
            {},
            "datasets[1].name",
            'bad datasets[1].name: "lerobot/a" is datasets[0] too',
        ),
        (
            [{"name": "lerobot/a"}, {"name": "sqlite:////x.db"}],
            {},
            "datasets[1].name",
            "bad datasets[1].name:",
        ),
        (
            [{"name": "lerobot/a"}, {"name": "lerobot/b"}],
            {"dataset_name": "lerobot/b"},
            "dataset_name",
            'bad dataset_name: "lerobot/b" (with datasets',
        ),
        (
            [{"name": "lerobot/a"}, {"name": "lerobot/b"}],
            {"cameras": {"base_0_rgb": "x"}},
            "cameras",
            "bad cameras: a mixture gives each dataset its own cameras",
        ),
        (
            [{"name": "lerobot/a"}, {"name": "lerobot/b"}],
            {"model": "smolvla-tiny"},
            "datasets",
            "bad datasets: smolvla-tiny takes no datasets",
        ),
    ],
)
def test_a_broken_mixture_is_refused_naming_its_place(
    parked: TestClient,
    alice: dict[str, str],
    stack: Stack,
    datasets: list[dict[str, Any]],
    extra: dict[str, Any],
    param: str,
    message: str,
) -> None:
    before = count_jobs(stack)
    body = {"model": "pi05-tiny", "steps": 20, "datasets": datasets, **extra}
    response = parked.post("/v1/fine-tunes", json=body, headers=alice)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith(message), error["message"]
    assert count_jobs(stack) == before


@pytest.mark.parametrize(
    ("settings", "rule"),
    [
        ({"api_shares_workers_disk": True}, "it names a local directory, and /nowhere/at/all does not exist"),
        ({"local_datasets": False}, "this server does not read local directories"),
    ],
)
def test_each_dataset_of_a_mixture_is_one_a_worker_can_read(
    stack: Stack, alice: dict[str, str], settings: dict[str, Any], rule: str
) -> None:
    from relay_api.app import create_app
    from tests.service.stack import PARKED_QUEUE

    app = create_app(stack.settings.model_copy(update={"fine_tune_queue": PARKED_QUEUE, **settings}))
    before = count_jobs(stack)
    body = {"model": "pi05-tiny", "datasets": [{"name": "lerobot/a"}, {"name": "/nowhere/at/all"}]}
    with TestClient(app) as api:
        response = api.post("/v1/fine-tunes", json=body, headers=alice)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "datasets[1].name"
    assert error["message"].startswith(f'bad datasets[1].name: "/nowhere/at/all" ({rule}'), error["message"]
    assert count_jobs(stack) == before


def test_a_mixture_of_datasets_that_cannot_share_a_model_is_refused_at_create(
    stack: Stack, alice: dict[str, str], dataset: Path, tmp_path: Path
) -> None:
    from relay_api.app import create_app
    from relay_engine.datasets import write_synthetic_dataset
    from tests.service.stack import PARKED_QUEUE

    wide = write_synthetic_dataset(tmp_path / "wide", episodes=2, episode_length=6, state_dim=3, action_dim=3)
    fast = write_synthetic_dataset(tmp_path / "fast", episodes=2, episode_length=6, fps=30)
    settings = {"fine_tune_queue": PARKED_QUEUE, "api_shares_workers_disk": True}
    before = count_jobs(stack)
    with TestClient(create_app(stack.settings.model_copy(update=settings))) as api:
        for other, rule in ((wide, "state is 3 wide and"), (fast, "records at 30 fps and")):
            body = {"model": "pi05-tiny", "datasets": [{"name": str(dataset)}, {"name": str(other)}]}
            response = api.post("/v1/fine-tunes", json=body, headers=alice)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "datasets[1]"
            assert error["message"].startswith(f"bad datasets[1]: {other}"), error["message"]
            assert rule in error["message"] and f"{dataset}" in error["message"]
    assert count_jobs(stack) == before


def test_a_mixture_job_made_over_plain_http_keeps_its_datasets(
    stack: Stack, user: tuple[str, str], dataset: Path, overhead_video: Path
) -> None:
    headers = {"authorization": f"Bearer {user[1]}"}
    body = {"model": "pi05-tiny", "steps": 20, "datasets": mixture(dataset, overhead_video)}
    with httpx.Client(base_url=stack.parked_api_url) as http:
        made = http.post("/v1/fine-tunes", json=body, headers=headers)
        assert made.status_code == 200, made.text
        job = made.json()
        again = http.get(f"/v1/fine-tunes/{job['id']}", headers=headers).json()
    assert job["dataset_name"] == str(dataset)  # the first dataset, filled in
    assert again["datasets"] == [
        {"name": str(dataset), "revision": None, "weight": 3.0, "cameras": None},
        {
            "name": str(overhead_video),
            "revision": None,
            "weight": 1.0,
            "cameras": {"base_0_rgb": "observation.images.overhead"},
        },
    ]
    # The stored job, sent back as it is, is a recipe the API takes again.
    assert (
        SFTConfig.parse({f: again[f] for f in SFTConfig.model_fields}).datasets
        == SFTConfig.parse(body).datasets
    )


def test_relay_fine_tunes_create_takes_a_mixture(
    stack: Stack, user: tuple[str, str], dataset: Path, overhead_video: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from relay.cli import app

    env = {"RELAY_BASE_URL": stack.parked_api_url, "RELAY_API_KEY": user[1], "RELAY_HOME": str(tmp_path)}
    base = ["fine-tunes", "create", "--model", "pi05-tiny", "--steps", "20", "--json"]
    made = CliRunner().invoke(
        app, [*base, "--mix", f"{dataset}:3", "--mix", "lerobot/pusht_image@v2.1"], env=env
    )
    assert made.exit_code == 0, made.output
    job = json.loads(made.output)
    assert [(d["name"], d["revision"], d["weight"]) for d in job["datasets"]] == [
        (str(dataset), None, 3.0),
        ("lerobot/pusht_image", "v2.1", 1.0),
    ]
    refused = CliRunner().invoke(app, [*base, "--mix", "lerobot/a:0", "--mix", "lerobot/b"], env=env)
    assert refused.exit_code == 2 and "bad datasets[0].weight: 0" in refused.output


def test_a_mixture_job_trains_and_reports_each_dataset(
    stack: Stack, worker: WorkerProcess, client: Client, dataset: Path, overhead_video: Path, tmp_path: Path
) -> None:
    config = SFTConfig(
        model="pi05-tiny",
        datasets=mixture(dataset, overhead_video),
        batch_size=2,
        finetune="lora",
        steps=4,
        validation_episodes=[0],
    )
    job = train(config, client=client)
    job.wait(poll=1)
    assert job.status == "completed", job.error
    read = job.dataset
    assert read is not None and read["path"] == str(dataset)
    assert [(part["path"], part["format"], part["share"]) for part in read["mixture"]] == [
        (str(dataset), "v2.1", 0.75),
        (str(overhead_video), "v3.0", 0.25),
    ]
    assert job.datasets is not None and [d["weight"] for d in job.datasets] == [3.0, 1.0]
    last = job.validation["last"] if job.validation else None
    assert last is not None
    assert [part["dataset"] for part in last["datasets"]] == [str(dataset), str(overhead_video)]
    assert last["frames"] == sum(part["frames"] for part in last["datasets"])
    card = job.summary()
    assert card.validation is not None
    assert [part["dataset"] for part in card.validation.last.model_dump()["datasets"]] == [
        str(dataset),
        str(overhead_video),
    ]
    (scored,) = [e for e in job.events() if e.kind == "validation" and e["step"] == 4]
    assert f"; {overhead_video.name}: action error" in validation_line(scored)
    # The CLI's view of the job: what was read, and each dataset's validation.
    from typer.testing import CliRunner

    from relay.cli import app

    env = {
        "RELAY_BASE_URL": stack.api_url,
        "RELAY_API_KEY": client.api_key or "",
        "RELAY_HOME": str(tmp_path),
        "COLUMNS": "400",
    }
    shown = CliRunner().invoke(app, ["fine-tunes", "retrieve", job.id], env=env)
    assert shown.exit_code == 0, shown.output
    assert "(75% of samples), mixed with 1 more dataset" in shown.output, shown.output
    assert (
        f"{dataset.name}: action error" in shown.output
        and f"{overhead_video.name}: action error" in shown.output
    )
