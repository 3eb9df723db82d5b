"""A tuned SmolVLA served as pi05's policies are: `relay serve`'s server over HTTP and openpi's
websocket (the real openpi-client), its cameras by the names it was trained with, answers in the
robot's units equal to sampling the model in-process from the same seed's noise."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from relay.sft.config import SFTConfig
from relay_engine.acting import load_acting_policy, observation_sample, read_norm_stats, seeded_noise
from relay_engine.datasets import write_synthetic_dataset
from relay_engine.recipe import Recipe, run_recipe
from relay_worker.serving.server import RunningPolicyServer, ServingOptions, start_policy_server

from .conftest import KEY, as_json, observation

AUTH = {"Authorization": f"Bearer {KEY}"}
CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (32, 32)}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smolvla-served")
    dataset = write_synthetic_dataset(root / "data", episodes=3, episode_length=(6, 8), cameras=CAMERAS)
    config = SFTConfig(model="smolvla-tiny", dataset_name=str(dataset), steps=2, batch_size=2)
    result = run_recipe(Recipe(config), root / "run", on_event=lambda e: None, should_stop=lambda: False)
    return result.output_dir


@pytest.fixture(scope="module")
def server(tuned: Path) -> Iterator[RunningPolicyServer]:
    running = start_policy_server(tuned, token=KEY, options=ServingOptions(device="cpu"))
    yield running
    running.stop()


def test_a_tuned_smolvla_answers_over_http_and_openpi_s_websocket(
    tuned: Path, server: RunningPolicyServer
) -> None:
    obs = observation(3)
    answer = httpx.post(
        f"{server.url}/actions", json={"observation": as_json(obs), "seed": 7}, headers=AUTH, timeout=60
    )
    assert answer.status_code == 200, answer.text
    http_actions = np.asarray(answer.json()["actions"])
    assert http_actions.shape == (10, 2)

    # The same chunk in-process: the model sampled from seed 7's noise, back in the robot's units.
    policy, _, _ = load_acting_policy(str(tuned), "cpu")
    stats = read_norm_stats(tuned)
    images = {f"observation.images.{name}": image for name, image in obs["images"].items()}
    sample = observation_sample(images, np.asarray(obs["state"]), obs["prompt"], stats)
    noise = seeded_noise(policy, torch.Generator().manual_seed(7))
    chunk = policy.sample_actions(policy.collate([sample]), noise=noise[None]).numpy()
    np.testing.assert_allclose(http_actions, stats.unnormalize_actions(chunk)[0], rtol=0, atol=1e-4)

    client = WebsocketClientPolicy(host=server.url.removeprefix("http://"), port=None, api_key=KEY)
    metadata = client.get_server_metadata()
    assert metadata["kind"] == "smolvla" and metadata["cameras"] == list(CAMERAS)
    assert metadata["camera_slots"] == {name: name for name in CAMERAS}
    result = client.infer({**obs, "state": np.asarray(obs["state"]), "seed": 7})
    np.testing.assert_allclose(result["actions"], http_actions, rtol=0, atol=1e-4)
    client._ws.close()  # openpi-client has no close of its own

    missing = httpx.post(
        f"{server.url}/actions",
        json={"observation": {**as_json(obs), "images": {"top": as_json(obs)["images"]["top"]}}},
        headers=AUTH,
        timeout=60,
    )
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "observation.images.wrist"


def test_relay_serve_refuses_a_smolvla_base_by_name_saying_what_to_serve() -> None:
    from typer.testing import CliRunner

    from relay.cli import app

    refused = CliRunner().invoke(app, ["serve", "smolvla-tiny"])
    assert refused.exit_code == 1
    assert "smolvla-tiny acts once a job has tuned it for a robot's cameras" in refused.output
