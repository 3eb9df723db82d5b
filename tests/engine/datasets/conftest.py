"""Datasets the tests read: made by the synthetic maker, or by hand (handmade.py), in tmp dirs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relay_engine.datasets.synth import write_synthetic_dataset
from tests.engine.datasets.handmade import write_handmade_dataset

SYNTH_CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (24, 32)}


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic dataset: 6 episodes of 8-20 frames, 2 cameras, 2 tasks. Read-only."""
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("synthetic") / "ds",
        episodes=6,
        episode_length=(8, 20),
        cameras=SYNTH_CAMERAS,
        num_tasks=2,
        seed=1,
    )


@pytest.fixture(scope="session")
def handmade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_handmade_dataset(tmp_path_factory.mktemp("handmade") / "aloha")


@pytest.fixture
def broken(synthetic: Path, tmp_path: Path) -> Path:
    """A copy of the synthetic dataset for a test to break."""
    return Path(shutil.copytree(synthetic, tmp_path / "broken"))


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def episode_file(root: Path, episode: int) -> Path:
    return root / f"data/chunk-000/episode_{episode:06d}.parquet"


def rewrite_episode(root: Path, episode: int, change: Callable[[pa.Table], pa.Table]) -> None:
    path = episode_file(root, episode)
    table = pq.read_table(path)
    pq.write_table(change(table).replace_schema_metadata(table.schema.metadata), path)


def edit_info(root: Path, change: Callable[[dict], None]) -> None:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info, indent=4))
