"""SmolVLA jobs through the served API, Redis and a real Celery worker: the same statuses, events,
checkpoints and downloads as pi05's, lerobot's files as the output, and its refusals a 400."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import func, update

from relay.events import eval_report_path
from relay.http_client import Client
from relay.serving import deploy
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.models import deployments as deployments_table
from relay_engine.families.smolvla.policy import SmolVLAPolicy
from relay_worker.serving.server import ServingOptions, start_policy_server
from tests.service.stack import Stack, WorkerProcess
from tests.serving.conftest import png_base64 as png

pytestmark = pytest.mark.slow


def test_a_smolvla_job_runs_to_completion_with_lerobot_s_files(
    worker: WorkerProcess, client: Client, dataset: Path, tmp_path: Path
) -> None:
    job = train(
        SFTConfig(
            model="smolvla-tiny", dataset_name=str(dataset), batch_size=4, steps=8, validation_episodes=[1]
        ),
        client=client,
    )
    job.wait(poll=1)
    assert job.status == "completed", job.error
    assert job.step == 8 and job.loss is not None
    # Its validation split, scored after the checkpoint, is the job's validation block.
    assert job.validation is not None and job.validation["scored"] == 1, job.validation
    last = job.validation["last"]
    assert (
        last["step"] == 8 and last["episodes"] == 1 and last["blind_mse"] > 0 and last["mean_action_mse"] > 0
    )
    described = job.to_dict()
    assert described["finetune"] == "full" and described["learning_rate"] == 1e-3

    events = job.events()
    assert [e["step"] for e in events if e.get("event") == "checkpoint"] == [8]
    assert job.dataset is not None and job.dataset["path"] == str(dataset)

    files = {f["path"] for f in job.files()}
    assert {
        "output/model.safetensors",
        "output/config.json",
        "output/policy_preprocessor.json",
        "output/policy_postprocessor.json",
        "output/vlm/config.json",
        "output/vlm/tokenizer.json",
    } <= files
    # The results card says how to use it: Relay's loader, lerobot's, the scoring command.
    use = job.summary().use
    assert use.ready and "SmolVLAPolicy.from_lerobot" in use.python and use.lerobot is not None
    assert f"relay local eval --model {job.id}" in use.deploy
    target = job.download(tmp_path / "weights")
    assert json.loads((target / "config.json").read_text())["type"] == "smolvla"
    tuned = SmolVLAPolicy.from_lerobot(target, target / "vlm")
    assert tuned.action_dim > 0 and tuned.cameras

    # A second job starts from the first's weights, by its id (the worker finds its output).
    again = train(
        SFTConfig(
            model="smolvla-tiny", dataset_name=str(dataset), batch_size=4, steps=2, from_checkpoint=job.id
        ),
        client=client,
    ).wait(poll=1)
    assert again.status == "completed", again.error
    weights = again.refresh().to_dict()["weights"]  # where its starting weights came from
    assert weights["job"] == job.id and weights["model"] == "smolvla-tiny", weights


def test_a_smolvla_job_s_eval_block_runs_it_in_the_simulator_on_the_worker(
    stack: Stack, worker: WorkerProcess, client: Client, dataset: Path
) -> None:
    """The recipe's eval block on the service: the worker runs the SmolVLA it trained in relay/Dot-v0
    (its cameras by the dataset's names), and the job reports the evaluation and keeps its files."""
    block = {"env": "relay/Dot-v0", "episodes": 2, "max_steps": 5, "videos": 1}
    config = SFTConfig(model="smolvla-tiny", dataset_name=str(dataset), batch_size=4, steps=3, eval=block)
    job = train(config, client=client).wait(poll=1)
    assert job.status == "completed", job.error
    [evaluation] = job.evaluations()
    assert (evaluation.step, evaluation.env, evaluation.episodes) == (3, "relay/Dot-v0", 2)
    assert 1 <= evaluation.mean_length <= 5 and evaluation.videos == ["eval/step-00000003/episode_0000.mp4"]
    headers = {"authorization": f"Bearer {client.api_key}"}
    files = httpx.get(f"{stack.api_url}/v1/fine-tunes/{job.id}/files", headers=headers).json()["data"]
    assert {eval_report_path(3), *evaluation.videos} <= {f["path"] for f in files}
    card = job.summary()
    assert card.eval is not None and card.eval.evaluated == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "smolvla-tiny", "cameras": {"base_0_rgb": "observation.images.top"}}, "cameras"),
        ({"model": "smolvla-tiny", "targets": ["vision"]}, "targets"),
        ({"model": "smolvla-tiny", "task": "user-churn"}, "task"),
        ({"model": "smolvla-tiny", "validation_episodes": 1.5}, "validation_episodes"),
    ],
)
def test_what_smolvla_does_not_take_is_a_400_naming_the_field(
    stack: Stack, user: tuple[str, str], dataset: Path, fields: dict[str, object], param: str
) -> None:
    response = httpx.post(
        f"{stack.api_url}/v1/fine-tunes",
        json={"dataset_name": str(dataset), **fields},
        headers={"Authorization": f"Bearer {user[1]}"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_tuned_smolvla_is_deployed_and_answers_actions_through_the_api(
    stack: Stack, worker: WorkerProcess, client: Client, dataset: Path, tmp_path: Path
) -> None:
    """Deployed from its job, the SmolVLA answers POST /v1/deployments/{id}/actions through the API
    with the chunk its downloaded output gives for the same seed in this process; its base by name
    is refused (it was tuned for no robot yet)."""
    job = train(
        SFTConfig(model="smolvla-tiny", dataset_name=str(dataset), batch_size=4, steps=3), client=client
    )
    job.wait(poll=0.5)
    assert job.status == "completed", job.error
    refused = httpx.post(
        f"{stack.api_url}/v1/deployments",
        json={"model": "smolvla-tiny"},
        headers={"authorization": f"Bearer {client.api_key}"},
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
    _ask_stray_deployments_to_stop(stack)
    serving = stack.start_standby_worker(queues=(stack.settings.serving_queue,))
    serving.wait_ready()
    deployment = deploy(job.id, client=client)
    try:
        deployment.wait_ready(timeout=120, poll=0.2)
        weights = job.download(tmp_path / "weights")
        features = json.loads((weights / "config.json").read_text())["input_features"]
        cameras = [name for name, feature in features.items() if feature["type"] == "VISUAL"]
        rng = np.random.default_rng(0)
        observation = {
            "images": {name: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for name in cameras},
            "state": rng.normal(size=2).tolist(),
            "prompt": "move to the dot",
        }
        served = deployment.actions(observation, seed=5)
        np.testing.assert_allclose(served, local_answer(weights, observation, seed=5), atol=1e-4)
    finally:
        deployment.stop()
        serving.stop()


def local_answer(weights: Path, observation: dict[str, Any], seed: int) -> np.ndarray:
    """The chunk a policy server started here on `weights` answers for the observation (its images
    as uint8 arrays) and seed: what a deployment of the same weights must answer."""
    local = start_policy_server(weights, options=ServingOptions(device="cpu"))
    try:
        images = {name: png(frame) for name, frame in observation["images"].items()}
        body = {"observation": {**observation, "images": images}, "seed": seed}
        return np.asarray(httpx.post(f"{local.url}/actions", json=body, timeout=60).json()["actions"])
    finally:
        local.stop()


def _ask_stray_deployments_to_stop(stack: Stack) -> None:
    """A stop asked of every deployment other tests left waiting (the schema fuzz creates some
    while no serving worker is alive): a serving worker holds one deployment for its life, so one
    queued before this test's would take the worker it starts, and this one would wait for an hour."""
    with stack.sessions() as db:
        db.execute(
            update(deployments_table)
            .where(deployments_table.c.status == "starting", deployments_table.c.stop_requested_at.is_(None))
            .values(stop_requested_at=func.now())
        )
        db.commit()
