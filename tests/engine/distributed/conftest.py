from __future__ import annotations

from pathlib import Path

import pytest

from relay_engine.datasets import LeRobotDataset, open_dataset, write_synthetic_dataset


@pytest.fixture(scope="session")
def synthetic_dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("synthetic") / "dataset", episodes=8, episode_length=(12, 20), seed=3
    )


@pytest.fixture(scope="session")
def dataset_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dataset-cache")


@pytest.fixture(scope="session")
def synthetic_dataset(synthetic_dataset_path: Path, dataset_cache: Path) -> LeRobotDataset:
    return open_dataset(str(synthetic_dataset_path), cache_dir=dataset_cache)
