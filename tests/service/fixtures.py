"""Fixtures over the shared Stack, for tests/service and tests/sdk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

from relay.http_client import Client
from relay_api.app import create_app
from tests.service.stack import PARKED_QUEUE, Stack, WorkerProcess, shared_stack

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    with shared_stack() as started:
        yield started


@pytest.fixture
def worker(stack: Stack) -> WorkerProcess:
    """The shared worker process, ready (restarted if an earlier test killed it)."""
    return stack.worker()


@pytest.fixture
def user(stack: Stack) -> tuple[str, str]:
    return stack.new_user()


@pytest.fixture
def client(stack: Stack, user: tuple[str, str]) -> Iterator[Client]:
    """An SDK client of the served API, as a fresh user."""
    client = Client(stack.api_url, user[1], max_retries=0)
    yield client
    client.close()


@pytest.fixture(scope="session")
def dataset(stack: Stack) -> Path:
    return stack.dataset()


# Two cameras of different sizes, five episodes, two tasks.
VIDEO_CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (24, 32)}


@pytest.fixture(scope="session")
def video_dataset(stack: Stack) -> Path:
    """A LeRobot v3.0 dataset with H.264 video cameras, two episodes to an mp4."""
    return stack.dataset(
        "v30-video", episodes=5, episode_length=(6, 14), cameras=VIDEO_CAMERAS, num_tasks=2, format="v3.0",
        video=True, episodes_per_file=2,
    )  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's headless Chromium, for a module of the console's browser tests."""
    from tests.service.browser import chromium  # Playwright, only where a test drives a browser

    with chromium() as started:
        yield started


@pytest.fixture(scope="module")
def parked(stack: Stack) -> Iterator[TestClient]:
    """The API in this process, publishing recipe jobs to a queue no worker reads: they stay queued."""
    settings = stack.settings.model_copy(update={"fine_tune_queue": PARKED_QUEUE})
    with TestClient(create_app(settings)) as api:
        yield api


@pytest.fixture
def alice(stack: Stack) -> dict[str, str]:
    """The request headers of a fresh user."""
    return {"authorization": f"Bearer {stack.new_user()[1]}"}
