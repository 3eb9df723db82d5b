"""Fixtures of the engine's tests.

`one_torch_thread` is applied per folder (the models', relational and tuning folders' conftests,
and training/test_learning.py), not to every engine test: seeded runs repeat only at a fixed
thread count, and the other tests' expectations were measured as they run now. The synthetic
dataset is the distributed and training tests'.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from relay_engine.datasets import LeRobotDataset, open_dataset, write_synthetic_dataset


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the test: tiny tensors, and on a shared 2-core machine threads waiting
    on each other cost more than they bring (about 3x slower under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
