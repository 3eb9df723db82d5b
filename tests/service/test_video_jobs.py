"""The service end to end on a LeRobot v3.0 video dataset, the format lerobot writes today: a
small dataset made by `relay datasets synth --format v3.0 --video` (H.264 mp4s, two episodes per
file, so the second starts partway into it), trained on through every way in that the service
has, against the real API, PostgreSQL, Redis and the shared Celery worker:

- a recipe job made with the SDK (`relay.sft.train`), its weights downloaded and loaded;
- the same job posted as plain JSON to `POST /v1/fine-tunes`, as curl would;
- `relay fine-tunes create --model pi05-tiny --dataset DIR --steps N`;
- a training-loop session fed samples read from the dataset (pixels decoded from the mp4s), whose
  losses and sampled actions equal those of the engine run in this process on the same samples.

One dataset and the session's shared stack serve every test here; each job trains a few steps of
batch 2 (seconds on a CPU worker).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from relay.cli import app
from relay.http_client import Client
from relay.optimizer import AdamParams
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay.training import ServiceClient, types
from relay_engine.datasets import open_dataset
from relay_engine.families.pi05.session import SessionSpec, TrainingSession
from relay_engine.families.robot_scores import evaluate_actions, with_norm_stats
from relay_engine.models import load_policy
from relay_engine.recipe import Recipe, run_recipe
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow

EPISODES = 4
STEPS = 3
CAMERAS = ("observation.images.top=32x32", "observation.images.wrist=24x32")


@pytest.fixture(scope="module")
def video_dataset(stack: Stack) -> Path:
    """`relay datasets synth --format v3.0 --video`, small: 4 episodes of 8 to 12 frames, two
    episodes per data file and per mp4, two cameras."""
    path = stack.root / "datasets" / "v30-video-from-the-cli"  # not the shared fixture's name: its own shape
    if not path.exists():
        result = CliRunner().invoke(
            app,
            [
                *("datasets", "synth", str(path), "--format", "v3.0", "--video"),
                *("--episodes", str(EPISODES), "--length", "8-12", "--episodes-per-file", "2"),
                *(arg for camera in CAMERAS for arg in ("--camera", camera)),
            ],
        )
        assert result.exit_code == 0, result.output
    info = json.loads((path / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert {
        name: f["dtype"] for name, f in info["features"].items() if name.startswith("observation.images")
    } == {
        "observation.images.top": "video",
        "observation.images.wrist": "video",
    }
    assert len(list((path / "videos/observation.images.top/chunk-000").glob("*.mp4"))) == 2
    return path


def what_was_read(dataset: Path) -> dict[str, Any]:
    """The dataset block a job on `dataset` must report: a local v3.0 directory."""
    info = json.loads((dataset / "meta/info.json").read_text())
    return {
        "repo": None,
        "path": str(dataset),
        "revision": None,
        "sha": None,
        "format": "v3.0",
        "frames": info["total_frames"],
        "episodes": EPISODES,
    }


def test_an_sdk_recipe_job_trains_on_it_and_its_weights_load(
    worker: WorkerProcess, client: Client, video_dataset: Path, tmp_path: Path
) -> None:
    config = SFTConfig(
        model="pi05-tiny", dataset_name=str(video_dataset), batch_size=2, steps=STEPS, name="v30"
    )
    job = train(config, client=client)
    job.wait(poll=1, progress=False)
    assert job.status == "completed", job.error
    assert job.step == STEPS and job.loss is not None and np.isfinite(job.loss)
    # The worker trained on the frames the engine decodes here: the same seeded recipe run in this
    # process reports the same loss (pixels decoded wrongly on the worker would change it).
    here: list[Any] = []
    run_recipe(
        Recipe.from_config(config, num_workers=0),
        tmp_path / "here",
        on_event=here.append,
        should_stop=lambda: False,
        dataset_cache_dir=tmp_path / "cache",
    )
    assert job.loss == pytest.approx([e.loss for e in here if e.kind == "metrics"][-1], rel=1e-5)
    assert job.dataset == what_was_read(video_dataset)
    assert job.refresh().to_dict()["dataset"] == what_was_read(video_dataset)
    assert job.events()[-2:] == [
        {"step": STEPS, "event": "finished"},
        {"step": STEPS, "event": "stage", "stage": "writing"},
    ]

    target = job.download(tmp_path / "weights")
    tuned = load_policy(str(target))
    base = load_policy("pi05-tiny")
    tuned_weights, base_weights = tuned.state_dict(), base.state_dict()
    assert tuned_weights.keys() == base_weights.keys()
    # Every weight trains at pi05-tiny's defaults (full, 1e-3): three steps move them.
    assert any(not torch.equal(tuned_weights[k], base_weights[k]) for k in base_weights)
    # The downloaded policy samples actions for frames decoded from the mp4s.
    dataset = with_norm_stats(open_dataset(str(video_dataset), cache_dir=tmp_path / "cache"), target)
    assert np.isfinite(evaluate_actions(tuned, dataset, [0, len(dataset) - 1]).mse)


def test_a_job_posted_as_plain_json_trains_on_it(
    stack: Stack, worker: WorkerProcess, user: tuple[str, str], video_dataset: Path
) -> None:
    headers = {"authorization": f"Bearer {user[1]}"}
    body = {"model": "pi05-tiny", "dataset_name": str(video_dataset), "batch_size": 2, "steps": STEPS}
    created = httpx.post(f"{stack.api_url}/v1/fine-tunes", json=body, headers=headers)
    assert created.status_code == 200, created.text
    job = created.json()
    assert job["status"] == "queued" and job["dataset"] is None
    deadline = time.monotonic() + 120
    while job["status"] not in ("completed", "error", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
        job = httpx.get(f"{stack.api_url}/v1/fine-tunes/{job['id']}", headers=headers).json()
    assert job["status"] == "completed", job["error"]
    assert job["step"] == STEPS
    assert job["dataset"] == what_was_read(video_dataset)
    files = httpx.get(f"{stack.api_url}/v1/fine-tunes/{job['id']}/files", headers=headers).json()
    assert "output/model.safetensors" in {f["path"] for f in files["data"]}


def test_the_cli_creates_a_job_on_it(
    stack: Stack, worker: WorkerProcess, user: tuple[str, str], video_dataset: Path, tmp_path: Path
) -> None:
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": user[1], "RELAY_HOME": str(tmp_path / "home")}
    result = CliRunner().invoke(
        app,
        [
            *("fine-tunes", "create", "--model", "pi05-tiny", "--dataset", str(video_dataset)),
            *("--steps", str(STEPS), "--batch-size", "2", "--wait", "--json"),
        ],
        env=env,
    )
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert job["status"] == "completed" and job["step"] == STEPS
    assert job["dataset"] == what_was_read(video_dataset)


@pytest.fixture
def service(stack: Stack, user: tuple[str, str], worker: WorkerProcess) -> Iterator[ServiceClient]:
    client = ServiceClient(stack.api_url, user[1], progress=False)
    yield client
    client.close()


def test_a_training_loop_session_trains_and_samples_on_its_frames(
    service: ServiceClient, video_dataset: Path, tmp_path: Path
) -> None:
    """The README's session loop on samples of the v3.0 video dataset: the worker computes what the
    engine computes here on the same samples, so the decoded frames travelled exactly."""
    data = open_dataset(str(video_dataset), cache_dir=tmp_path / "cache")
    assert data.source.format == "v3.0"

    def datum(i: int) -> types.Datum:
        s = data[i]
        observation = {"image": s["image"], "state": s["state"][: s["state_dim"]], "prompt": s["prompt"]}
        return types.Datum(observation=observation, actions=s["actions"][:, : s["action_dim"]])

    # Frames from every episode, among them the first of episode 1, which starts mid-mp4.
    starts = [int(data.indices_of_episodes([e])[0]) for e in range(EPISODES)]
    batches = [[datum(starts[0] + 2), datum(starts[1])], [datum(starts[2] + 1), datum(starts[3] + 3)]]
    assert {"base_0_rgb", "left_wrist_0_rgb"} <= set(batches[0][0].observation["image"])
    probe = datum(starts[1] + 1).observation
    adam = AdamParams(learning_rate=1e-3)

    with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
        futures = []
        for batch in batches:
            futures.append(training_client.forward_backward(batch, "flow_matching"))
            futures.append(training_client.optim_step(adam))
        sampled = training_client.sample(probe).result(timeout=120)
        results = [f.result(timeout=120) for f in futures]

    local = TrainingSession(SessionSpec(base_model="pi05-tiny", lora_rank=8))
    for step, batch in enumerate(batches):
        fb, optim = results[2 * step : 2 * step + 2]
        expected = local.forward_backward(
            [{"observation": d.observation, "actions": d.actions} for d in batch]
        )
        assert fb.metrics["loss"] == pytest.approx(expected["metrics"]["loss"], rel=1e-5)
        expected_step = local.optim_step(adam)
        assert optim.metrics["skipped"] is False
        assert optim.metrics["grad_norm"] == pytest.approx(expected_step["metrics"]["grad_norm"], rel=1e-4)
    assert sampled.shape == (10, 32) and np.isfinite(sampled).all()
    np.testing.assert_allclose(sampled, local.sample([probe])[0], rtol=1e-4, atol=1e-5)
