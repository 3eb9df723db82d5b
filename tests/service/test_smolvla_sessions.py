"""SmolVLA training-loop sessions through the real service: the API, Redis, PostgreSQL and a Celery
worker (docs/sessions.md, "SmolVLA sessions"). The datums are a made-up two-camera robot's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from relay.errors import RequestFailedError
from relay.http_client import Client
from relay.serving import deploy
from relay.training import ServiceClient, types
from tests.service.stack import Stack, WorkerProcess
from tests.service.test_smolvla_jobs import _ask_stray_deployments_to_stop, local_answer

pytestmark = pytest.mark.slow

ADAM = types.AdamParams(learning_rate=1e-3)
CHUNK = 10  # smolvla-tiny's
CAMERAS = ("observation.images.front", "observation.images.wrist")


@pytest.fixture
def service(stack: Stack, user: tuple[str, str], worker: WorkerProcess) -> Iterator[ServiceClient]:
    client = ServiceClient(stack.api_url, user[1], progress=False)
    yield client
    client.close()


def observation(rng: np.random.Generator, cameras: tuple[str, ...] = CAMERAS) -> dict[str, Any]:
    return {
        "image": {name: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for name in cameras},
        "state": rng.normal(size=6).astype(np.float32),
        "prompt": "move to the dot",
    }


def batch(seed: int, size: int = 6) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    return [
        types.Datum(
            observation=observation(rng), actions=0.5 * rng.normal(size=(CHUNK, 6)).astype(np.float32)
        )
        for _ in range(size)
    ]


def test_a_smolvla_session_learns_samples_and_resumes_from_its_state(service: ServiceClient) -> None:
    data = batch(0)
    with service.create_full_training_client("smolvla-tiny") as training_client:
        assert training_client.info["action_horizon"] == CHUNK
        losses = []
        for _ in range(8):
            step = training_client.forward_backward(data)
            training_client.optim_step(ADAM)
            losses.append(step.result(timeout=120).metrics["loss"])
        assert losses[-1] < 0.8 * losses[0], losses
        # forward draws the noise the next forward_backward will: the same loss.
        expected = float(training_client.forward(data).result(timeout=120)["loss"].mean())
        training_client.save_state("eight").result(timeout=120)
        assert training_client.forward_backward(data).result(timeout=120).metrics["loss"] == pytest.approx(
            expected, abs=1e-5
        )
        sampler = training_client.save_weights_and_get_sampling_client("eight")
        observations = [d.observation for d in data[:3]]
        chunks = sampler.sample(observations, num_steps=4).result(timeout=120)
        assert chunks.shape == (3, CHUNK, 32) and np.isfinite(chunks).all()
        assert (Path(sampler.path) / "config.json").is_file()

        # A datum with other cameras than the session's first, or a chunk of another length, is
        # refused naming the datum; the session goes on.
        rng = np.random.default_rng(1)
        other = types.Datum(observation=observation(rng, ("top",)), actions=np.zeros((CHUNK, 6)))
        with pytest.raises(RequestFailedError, match="datum 0: image has cameras \\['top'\\]") as error:
            training_client.forward_backward([other]).result(timeout=120)
        assert error.value.category == "user"
        short = types.Datum(observation=observation(rng), actions=np.zeros((CHUNK - 1, 6)))
        with pytest.raises(RequestFailedError, match="datum 0: actions must be 10 steps long"):
            training_client.forward_backward([short]).result(timeout=120)
        assert training_client.forward_backward(data).result(timeout=120).metrics["loss"] > 0

    with service.create_full_training_client("smolvla-tiny") as resumed:
        fresh = float(resumed.forward(data).result(timeout=120)["loss"].mean())
        resumed.load_state("eight").result(timeout=120)
        loaded = float(resumed.forward(data).result(timeout=120)["loss"].mean())
        assert loaded == pytest.approx(expected, abs=1e-5) and fresh != pytest.approx(expected, abs=1e-3)


def test_a_smolvla_lora_session_trains_its_adapters_and_saves_a_plain_smolvla(service: ServiceClient) -> None:
    """create_lora_training_client on SmolVLA: adapters where lerobot puts them (far fewer weights
    train than in full), the loss on a batch falls, and saved weights are a plain SmolVLA (merged,
    under lerobot's names) that samples."""
    from safetensors.torch import load_file

    from relay_engine.families.smolvla.policy import SmolVLAPolicy

    data = batch(0)
    with service.create_lora_training_client("smolvla-tiny", rank=4) as training_client:
        assert training_client.info["trainable_params"] < 20_000
        # The flow-matching loss is noisy step to step (new noise and times each step): the means of
        # the first and last three of 12 steps, at LoRA's larger rate (25% apart over seeds 0 to 4).
        losses = []
        for _ in range(12):
            step = training_client.forward_backward(data)
            training_client.optim_step(types.AdamParams(learning_rate=1e-2))
            losses.append(step.result(timeout=120).metrics["loss"])
        assert np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses
        sampler = training_client.save_weights_and_get_sampling_client("adapted")
        chunks = sampler.sample([d.observation for d in data[:2]], num_steps=4).result(timeout=120)
        assert chunks.shape == (2, CHUNK, 32) and np.isfinite(chunks).all()
    saved = Path(sampler.path)
    assert not [name for name in load_file(str(saved / "model.safetensors")) if "lora_" in name]
    SmolVLAPolicy.from_lerobot(saved, saved / "vlm")  # strict


def test_what_a_smolvla_session_does_not_take_is_refused(stack: Stack, user: tuple[str, str]) -> None:
    headers = {"authorization": f"Bearer {user[1]}"}
    cases = [
        ({"base_model": "smolvla-tiny", "lora_rank": 8}, "lora_rank", "smolvla-tiny takes no lora_rank"),
        ({"base_model": "smolvla-tiny", "targets": ["vision"]}, "targets", "smolvla-tiny takes no targets"),
        (
            {"base_model": "smolvla", "action_horizon": 20},
            "action_horizon",
            "smolvla takes no action_horizon",
        ),
    ]
    for body, param, message in cases:
        answer = httpx.post(f"{stack.api_url}/v1/sessions", headers=headers, json=body)
        assert answer.status_code == 400, body
        error = answer.json()["error"]
        assert message in error["message"] and error["param"] == param, error


def test_a_smolvla_sessions_saved_weights_are_deployed(
    stack: Stack, service: ServiceClient, user: tuple[str, str]
) -> None:
    """Served by a deployment, a session's saved weights answer with the chunk a local policy
    server on the same directory gives for the same seed (in the session's normalized units)."""
    data = batch(2)
    with service.create_full_training_client("smolvla-tiny") as training_client:
        training_client.forward_backward(data)
        training_client.optim_step(ADAM).result(timeout=120)
        sampler = training_client.save_weights_and_get_sampling_client("served")
        model = f"{training_client.id}/served"
    _ask_stray_deployments_to_stop(stack)
    serving = stack.start_standby_worker(queues=(stack.settings.serving_queue,))
    serving.wait_ready()
    client = Client(stack.api_url, user[1], max_retries=0)
    deployment = deploy(model, client=client)
    try:
        deployment.wait_ready(timeout=120, poll=0.2)
        rng = np.random.default_rng(3)
        raw = observation(rng)
        request = {"images": raw["image"], "state": raw["state"].tolist(), "prompt": raw["prompt"]}
        served = deployment.actions(request, seed=5)
        assert served.shape == (CHUNK, 6)
        np.testing.assert_allclose(served, local_answer(Path(sampler.path), request, seed=5), atol=1e-4)
    finally:
        deployment.stop()
        serving.stop()
        client.close()
