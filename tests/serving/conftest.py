"""Fixtures of the serving tests: a tuned-looking pi05-tiny (two saved cameras, a 2-wide state and
action, a norm_stats.json) and a policy server on it, with a key, on a free loopback port."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from relay_engine.datasets.norm_stats import NormStats, Stats
from relay_engine.models import load_policy
from relay_engine.models.lerobot_files import RobotFeatures
from relay_worker.serving.server import RunningPolicyServer, ServingOptions, start_policy_server

KEY = "serving-test-key"
CAMERAS = ("observation.images.top", "observation.images.wrist")
# Stats far from the identity, so that a missed (un)normalization shows.
STATS = NormStats(
    state=Stats(mean=np.zeros(2), std=np.ones(2), q01=np.array([-3.0, 10.0]), q99=np.array([5.0, 30.0])),
    actions=Stats(mean=np.zeros(2), std=np.ones(2), q01=np.array([-2.0, 100.0]), q99=np.array([6.0, 140.0])),
)
MAX_BODY_BYTES = 256 * 1024


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny tensors: threads waiting on each other on a shared 2-core machine cost more than they
    bring, and one thread keeps the in-process reference's rounding the server's."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fine-tune's output as `relay fine-tunes download` leaves it: weights, lerobot's config
    naming two cameras, and norm_stats.json."""
    directory = tmp_path_factory.mktemp("served") / "output"
    features = RobotFeatures({camera: (32, 32) for camera in CAMERAS}, state_dim=2, action_dim=2)
    load_policy("pi05-tiny").save_pretrained(directory, features)
    (directory / "norm_stats.json").write_text(STATS.to_json())
    return directory


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningPolicyServer]:
    options = ServingOptions(max_batch=8, max_wait_ms=20.0, max_body_bytes=MAX_BODY_BYTES, device="cpu")
    running = start_policy_server(model_dir, token=KEY, options=options)
    yield running
    running.stop()


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def png_base64(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def observation(seed: int) -> dict[str, Any]:
    """A robot's observation as arrays: two camera images, a raw state, a prompt."""
    rng = np.random.default_rng(1000 + seed)
    return {
        "images": {"top": image(2 * seed), "wrist": image(2 * seed + 1)},
        "state": [float(rng.uniform(-3, 5)), float(rng.uniform(10, 30))],
        "prompt": f"move to dot {seed}",
    }


def as_json(obs: dict[str, Any]) -> dict[str, Any]:
    """The same observation as JSON carries it: images as base64 PNG."""
    return {**obs, "images": {name: png_base64(array) for name, array in obs["images"].items()}}
