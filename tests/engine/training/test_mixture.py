"""A recipe that trains pi05-tiny on a mixture: a LeRobot v2.1 image dataset and a v3.0 video dataset
whose cameras have other names, each mapped to the model's cameras by its own map. The statistics
are those of all the frames together, sampling follows the weights, validation reports each dataset,
the dataset event names every dataset read, and datasets that cannot share a model are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relay.dataset_mixture import DatasetSource
from relay.events import DatasetEvent, ValidationEvent
from relay.sft.config import SFTConfig
from relay_engine.core.data import BatchOrder, DataPosition
from relay_engine.datasets import compute_norm_stats, open_dataset, write_synthetic_dataset
from relay_engine.datasets.mixture import DatasetMixture, WeightedFrames, open_mixture, sample_counts
from relay_engine.errors import ConfigError
from relay_engine.models import load_policy
from relay_engine.recipe import Recipe, run_recipe

IMAGE_CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (32, 32)}
VIDEO_CAMERAS = {"observation.images.overhead": (32, 32)}


@pytest.fixture(scope="module")
def image_v21(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("mix") / "image",
        episodes=6,
        episode_length=(8, 10),
        cameras=IMAGE_CAMERAS,
        seed=1,
    )


@pytest.fixture(scope="module")
def video_v30(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("mix") / "video",
        episodes=4,
        episode_length=(20, 24),
        cameras=VIDEO_CAMERAS,
        format="v3.0",
        video=True,
        seed=2,
    )


def sources(image: Path, video: Path, weights: tuple[float, float] = (1.0, 1.0)) -> list[DatasetSource]:
    return [
        DatasetSource(str(image), None, weights[0], {"base_0_rgb": "observation.images.top"}),
        DatasetSource(str(video), None, weights[1], {"base_0_rgb": "observation.images.overhead"}),
    ]


def test_statistics_are_those_of_every_frame_together(
    image_v21: Path, video_v30: Path, tmp_path: Path
) -> None:
    mixture = open_mixture(sources(image_v21, video_v30), action_horizon=4, cache_dir=str(tmp_path))
    alone = [open_dataset(str(p), action_horizon=4, cache_dir=tmp_path) for p in (image_v21, video_v30)]
    state = np.concatenate([part.columns()[0] for part in alone])
    actions = np.concatenate([part.columns()[1] for part in alone])
    expected = compute_norm_stats(state, actions)
    for part in mixture.parts:
        np.testing.assert_allclose(part.norm_stats.actions.q01, expected.actions.q01)
        np.testing.assert_allclose(part.norm_stats.state.q99, expected.state.q99)
        np.testing.assert_allclose(part.norm_stats.actions.mean, expected.actions.mean)
    # lerobot's pooled mean and standard deviation (frame-weighted mean, within- plus between-dataset
    # variance) are these exactly.
    counts = np.array([len(part) for part in alone], dtype=np.float64)[:, None]
    means = np.stack([part.norm_stats.actions.mean for part in alone])
    stds = np.stack([part.norm_stats.actions.std for part in alone])
    pooled_mean = (means * counts).sum(0) / counts.sum()
    pooled_std = np.sqrt(((stds**2 + (means - pooled_mean) ** 2) * counts).sum(0) / counts.sum())
    np.testing.assert_allclose(mixture.norm_stats.actions.mean, pooled_mean)
    np.testing.assert_allclose(mixture.norm_stats.actions.std, pooled_std)
    # Not either dataset's own: the mixture's statistics differ from the first dataset's alone.
    assert not np.allclose(mixture.parts[0].norm_stats.actions.q99, alone[0].norm_stats.actions.q99)
    # Each dataset's cameras land in the model's slot its own map names.
    assert mixture.parts[0].camera_map == {"base_0_rgb": "observation.images.top"}
    assert mixture.parts[1].camera_map == {"base_0_rgb": "observation.images.overhead"}
    assert set(mixture.parts[1][0]["image"]) == {"base_0_rgb"}


@pytest.mark.parametrize("weights", [(1.0, 1.0), (3.0, 1.0), (1.0, 4.0)])
def test_an_epoch_draws_each_dataset_at_its_share(
    image_v21: Path, video_v30: Path, tmp_path: Path, weights: tuple[float, float]
) -> None:
    mixture = open_mixture(sources(image_v21, video_v30, weights), action_horizon=4, cache_dir=str(tmp_path))
    training = [np.arange(len(part)) for part in mixture.parts]
    frames = WeightedFrames(mixture, training, seed=0)
    for epoch in range(3):
        drawn = frames.epoch_samples(epoch)
        assert len(drawn) == sum(len(part) for part in mixture.parts)
        share = np.mean(frames.part_of[drawn] == 0)
        assert abs(share - weights[0] / sum(weights)) <= 1 / len(drawn)
        # A dataset drawn more than its size gives every frame whole before repeating any a third time.
        for index, part in enumerate(mixture.parts):
            own = drawn[frames.part_of[drawn] == index]
            counts = np.bincount(frames.frame_of[own], minlength=len(part))
            assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_dataset_drawn_below_its_size_trains_on_every_frame_over_the_epochs(
    image_v21: Path, video_v30: Path, tmp_path: Path, seed: int
) -> None:
    # 3 to 1: the video dataset (86 frames) gives a quarter of an epoch's 140 samples, 35 of its
    # frames an epoch. A draw made once per run leaves the other 51 untrained however long the job.
    # Drawn afresh each epoch, 30 epochs miss a given frame with odds of (51/86)^30 (1.6e-7), any
    # of the 86 with odds of 1.4e-5.
    mixture = open_mixture(
        sources(image_v21, video_v30, (3.0, 1.0)), action_horizon=4, cache_dir=str(tmp_path)
    )
    training = [np.arange(len(part)) for part in mixture.parts]
    frames = WeightedFrames(mixture, training, seed=seed)
    video = len(mixture.parts[1])
    epochs = [frames.epoch_samples(epoch) for epoch in range(30)]
    video_frames = [set(frames.frame_of[drawn[frames.part_of[drawn] == 1]].tolist()) for drawn in epochs]
    assert all(len(seen) < video / 2 for seen in video_frames)
    assert video_frames[0] != video_frames[1]
    assert set().union(*video_frames) == set(range(video))
    # Each epoch's draw is a function of the seed and the epoch alone: a resumed run draws the same.
    again = WeightedFrames(mixture, training, seed=seed)
    assert all(np.array_equal(again.epoch_samples(epoch), drawn) for epoch, drawn in enumerate(epochs))


def test_the_seeded_order_shuffles_the_epochs_draw() -> None:
    draws = {0: np.array([5, 5, 6, 9]), 1: np.array([6, 7, 7, 8])}
    order = BatchOrder(4, 4, seed=3, span_epochs=True, epoch_samples=draws.__getitem__)
    batches = order.batches(DataPosition())
    first, second = next(batches), next(batches)
    assert sorted(first) == [5, 5, 6, 9] and sorted(second) == [6, 7, 7, 8]
    # The same shuffle as an epoch of each index once, applied to the draw.
    plain = BatchOrder(4, 4, seed=3, span_epochs=True).batches(DataPosition())
    assert first == draws[0][next(plain)].tolist()


def test_sample_counts_add_up_and_keep_every_dataset() -> None:
    assert sample_counts([10, 10], [0.5, 0.5]) == [10, 10]
    assert sample_counts([7, 100], [0.999, 0.001]) == [106, 1]
    assert sum(sample_counts([5, 9, 13], [0.2, 0.3, 0.5])) == 27


def test_datasets_of_other_widths_or_rates_are_refused_naming_both(image_v21: Path, tmp_path: Path) -> None:
    wide = write_synthetic_dataset(tmp_path / "wide", episodes=2, episode_length=6, action_dim=3, state_dim=3)
    with pytest.raises(
        ConfigError, match=r"datasets\[1\]: .*wide's state is 3 wide and .*image's \(datasets\[0\]\) is 2"
    ):
        open_mixture(
            [DatasetSource(str(image_v21), None, 1, None), DatasetSource(str(wide), None, 1, None)],
            action_horizon=4,
            cache_dir=str(tmp_path / "cache"),
        )
    fast = write_synthetic_dataset(tmp_path / "fast", episodes=2, episode_length=6, fps=30)
    with pytest.raises(ConfigError, match=r"records at 30 fps and .* at 10"):
        open_mixture(
            [DatasetSource(str(image_v21), None, 1, None), DatasetSource(str(fast), None, 1, None)],
            action_horizon=4,
            cache_dir=str(tmp_path / "cache"),
        )


def test_a_mixture_recipe_trains_and_reports_each_dataset(
    image_v21: Path, video_v30: Path, tmp_path: Path
) -> None:
    config = SFTConfig(
        model="pi05-tiny",
        datasets=[
            {
                "name": str(image_v21),
                "weight": 3,
                "cameras": {
                    "base_0_rgb": "observation.images.top",
                    "left_wrist_0_rgb": "observation.images.wrist",
                },
            },
            {"name": str(video_v30), "cameras": {"base_0_rgb": "observation.images.overhead"}},
        ],
        batch_size=4,
        steps=4,
        validation_episodes=[0],
    )
    events: list[Any] = []
    recipe = Recipe.from_config(config, checkpoint_every=2, log_every=1, num_workers=0)
    result = run_recipe(
        recipe,
        tmp_path / "work",
        on_event=events.append,
        should_stop=lambda: False,
        dataset_cache_dir=tmp_path / "cache",
        output_dir=tmp_path / "out",
    )
    assert result.step == 4
    read = [event for event in events if isinstance(event, DatasetEvent)]
    assert len(read) == 1 and read[0].path == str(image_v21)
    assert [part["path"] for part in read[0].mixture] == [str(image_v21), str(video_v30)]
    assert [part["share"] for part in read[0].mixture] == [0.75, 0.25]
    assert [part["format"] for part in read[0].mixture] == ["v2.1", "v3.0"]
    scored = [event for event in events if isinstance(event, ValidationEvent)]
    assert [event.step for event in scored] == [2, 4]
    for event in scored:
        assert [part["dataset"] for part in event.datasets] == [str(image_v21), str(video_v30)]
        assert event.frames == sum(part["frames"] for part in event.datasets)
        weighted = sum(part["mean_action_mse"] * part["frames"] for part in event.datasets) / event.frames
        assert event.mean_action_mse == pytest.approx(weighted)
        assert all(part["episodes"] == 1 for part in event.datasets)
    # The output is the first dataset's robot, normalized with the mixture's statistics.
    policy = load_policy(str(tmp_path / "out"))
    assert policy is not None
    mixture = open_mixture(
        [DatasetSource(str(image_v21), None, 3, None), DatasetSource(str(video_v30), None, 1, None)],
        action_horizon=4,
        cache_dir=str(tmp_path / "cache"),
    )
    saved = (tmp_path / "out" / "norm_stats.json").read_text()
    assert isinstance(mixture, DatasetMixture)
    assert saved == mixture.norm_stats.to_json()
