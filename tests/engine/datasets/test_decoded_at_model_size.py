"""Video cameras decoded into the frame index at the size pi05 reads (its ImageFit), not as
recorded: a batch collated from the cache is the batch collated from frames decoded per sample
(torch.equal); the cache's files are at the model's size; whether the frames fit the cache's limit
is judged at that size; one dataset keeps one cache per size."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.datasets import decoded_frames, open_dataset
from relay_engine.datasets.dataset import LeRobotDataset
from relay_engine.image_fit import ImageFit
from relay_engine.models import Pi05Collator, image_fit, named_config
from relay_engine.samples import Sample

RECORDED = {"observation.images.top": (96, 64), "observation.images.wrist": (40, 56)}
LIMIT = "RELAY_VIDEO_CACHE_MAX_BYTES"


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A v3.0 video dataset whose cameras are neither pi05-tiny's 32x32 nor square."""
    out = tmp_path_factory.mktemp("synth") / "video"
    cameras = [f"--camera={feature}={h}x{w}" for feature, (h, w) in RECORDED.items()]
    options = [
        "--format",
        "v3.0",
        "--video",
        "--episodes",
        "4",
        "--length",
        "5-9",
        "--episodes-per-file",
        "2",
    ]
    result = CliRunner().invoke(app, ["datasets", "synth", str(out), *options, "--tasks", "2", *cameras])
    assert result.exit_code == 0, result.output
    return out


def opened(root: Path, cache: Path, fit: ImageFit | None, **options: object) -> LeRobotDataset:
    options.setdefault("action_horizon", 5)
    return open_dataset(str(root), cache_dir=cache, image_fit=fit, **options)  # type: ignore[arg-type]


def both_ways(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fit: ImageFit, **options: object
) -> tuple[LeRobotDataset, LeRobotDataset]:
    cached = opened(root, tmp_path / "cache", fit, **options)
    assert set(cached._index.decoded) == set(RECORDED)
    with monkeypatch.context() as patch:
        patch.setenv(LIMIT, "0")
        per_sample = opened(root, tmp_path / "per-sample", fit, **options)
    assert not per_sample._index.decoded
    return cached, per_sample


def batches(dataset: LeRobotDataset, collate: Callable[[list[Sample]], Any], size: int = 5) -> list[Any]:
    order = np.random.default_rng(0).permutation(len(dataset)).tolist()
    return [collate([dataset[i] for i in order[at : at + size]]) for at in range(0, len(order), size)]


def test_pi05_batches_from_the_cache_are_the_per_sample_ones(
    video: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = named_config("pi05-tiny")
    size = config.vision.image_size
    fit = image_fit(size)
    cached, per_sample = both_ways(video, tmp_path, monkeypatch, fit, action_horizon=config.action_horizon)
    # The cache holds frames at the model's size, the per-sample path decodes them as recorded.
    directory = cached._index.directory / decoded_frames.directory_name(fit)
    assert directory.name == f"decoded-{size}x{size}-centre-aa"
    for feature, (height, width) in RECORDED.items():
        assert (directory / f"{feature}.rgb").stat().st_size == len(cached) * size * size * 3
        assert (directory / f"{feature}.rgb").stat().st_size < len(cached) * height * width * 3
    camera = next(iter(cached.camera_map))
    assert cached[0]["image"][camera].shape == (size, size, 3)
    assert per_sample[0]["image"][camera].shape == (*RECORDED[cached.camera_map[camera]], 3)
    assert not (cached._index.directory / decoded_frames.DIRECTORY).exists()  # none at recorded size
    collate = Pi05Collator(config)
    for from_cache, decoded in zip(batches(cached, collate), batches(per_sample, collate), strict=True):
        for field in ("images", "image_mask", "tokens", "token_mask", "actions", "action_mask", "weights"):
            assert torch.equal(getattr(from_cache, field), getattr(decoded, field)), field
        assert from_cache.image_mask.any()


def test_one_dataset_keeps_a_cache_per_model_size(video: Path, tmp_path: Path) -> None:
    small, large = ImageFit(32, 32), ImageFit(48, 80)
    first = opened(video, tmp_path, small)
    second = opened(video, tmp_path, large)
    assert first._index.directory == second._index.directory
    assert second[3]["image"]["base_0_rgb"].shape == (48, 80, 3)
    assert first[3]["image"]["base_0_rgb"].shape == (32, 32, 3)
    for fit in (small, large):
        assert (
            first._index.directory / decoded_frames.directory_name(fit) / decoded_frames.COMPLETE
        ).is_file()
    # Opened with no fit (SmolVLA, which resizes on its device; a tool, a bench): the frames as
    # recorded, in a cache of their own.
    recorded = opened(video, tmp_path, None)
    assert recorded[3]["image"]["base_0_rgb"].shape == (*RECORDED["observation.images.top"], 3)
    assert (recorded._index.directory / decoded_frames.DIRECTORY / decoded_frames.COMPLETE).is_file()


def test_the_limit_is_judged_at_the_model_s_size(
    video: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit = ImageFit(16, 16)
    frames = len(opened(video, tmp_path / "probe", None))
    at_model_size = decoded_frames.decoded_size(frames, decoded_frames.cached_sizes(RECORDED, fit))
    assert at_model_size == frames * 2 * 16 * 16 * 3 < decoded_frames.decoded_size(frames, RECORDED)
    monkeypatch.setenv(LIMIT, str(at_model_size))
    assert opened(video, tmp_path / "cache", fit)._index.decoded  # fits at 16x16
    assert not opened(video, tmp_path / "cache", None)._index.decoded  # not as recorded
    monkeypatch.setenv(LIMIT, str(at_model_size - 1))
    assert not opened(video, tmp_path / "over", fit)._index.decoded


def test_lerobot_records_default_fits_at_pi05_s_size() -> None:
    """50 episodes of 30 s at 30 fps, two 640x480 cameras: 77 GiB as recorded, over the default
    limit; 12.6 GiB at pi05's 224x224, under it."""
    frames, cameras = 50 * 30 * 30, {"a": (480, 640), "b": (480, 640)}
    assert decoded_frames.decoded_size(frames, cameras) > decoded_frames.DEFAULT_MAX_BYTES
    at_224 = decoded_frames.decoded_size(frames, decoded_frames.cached_sizes(cameras, image_fit(224)))
    assert at_224 == 90_000 * 224 * 224 * 3 < decoded_frames.DEFAULT_MAX_BYTES


def test_image_datasets_are_still_fitted_per_sample(tmp_path: Path) -> None:
    from relay_engine.datasets import write_synthetic_dataset

    root = write_synthetic_dataset(tmp_path / "images", episodes=2, episode_length=4, cameras=RECORDED)
    dataset = opened(root, tmp_path / "cache", image_fit(32))
    assert not dataset._index.decoded
    assert dataset[0]["image"]["base_0_rgb"].shape == (*RECORDED["observation.images.top"], 3)
