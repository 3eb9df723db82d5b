"""Training samples: images, normalized padded state, prompt, action chunks with padding masks."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from relay_engine.datasets import LeRobotDataset, open_dataset
from relay_engine.datasets.frame_index import fingerprint
from relay_engine.datasets.meta import require_meta
from relay_engine.errors import ConfigError, DatasetError
from relay_engine.samples import Sample
from tests.engine.datasets import handmade as hm
from tests.engine.datasets.conftest import episode_file


@pytest.fixture
def aloha(handmade: Path, cache_dir: Path) -> LeRobotDataset:
    return open_dataset(str(handmade), action_horizon=6, cache_dir=cache_dir)


def frame_of(episode: int, frame: int) -> int:
    return sum(hm.LENGTHS[:episode]) + frame


def test_summary_of_a_dataset_made_by_hand(aloha: LeRobotDataset, handmade: Path) -> None:
    summary = aloha.summary
    assert summary.name == str(handmade)
    assert (summary.episodes, summary.frames, summary.fps) == (5, sum(hm.LENGTHS), 50)
    assert summary.cameras == hm.CAMERAS
    assert (summary.state_dim, summary.action_dim) == (14, 14)
    assert summary.tasks == dict(enumerate(hm.TASKS))
    assert len(aloha) == sum(hm.LENGTHS)


def test_a_sample_has_the_shape_the_model_expects(aloha: LeRobotDataset) -> None:
    sample = aloha[frame_of(1, 4)]
    assert set(sample) == set(Sample.__annotations__) - {"weight"}
    assert aloha.camera_map == dict(
        zip(("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"), hm.CAMERAS, strict=True)
    )
    for camera, feature in aloha.camera_map.items():
        image = sample["image"][camera]
        assert image.dtype == np.uint8 and image.shape == (*hm.CAMERAS[feature], 3)
    assert sample["state"].dtype == np.float32 and sample["state"].shape == (32,)
    assert sample["actions"].dtype == np.float32 and sample["actions"].shape == (6, 32)
    assert sample["action_is_pad"].dtype == bool and sample["action_is_pad"].shape == (6,)
    assert (sample["state_dim"], sample["action_dim"]) == (14, 14)
    assert not sample["state"][14:].any() and not sample["actions"][:, 14:].any()


def test_images_are_the_stored_frames(aloha: LeRobotDataset, handmade: Path) -> None:
    table = pq.read_table(handmade / hm.DATA_PATH.format(episode_chunk=1, episode_index=2))
    for camera, feature in aloha.camera_map.items():
        stored = np.asarray(Image.open(io.BytesIO(table.column(feature)[9].as_py()["bytes"])))
        np.testing.assert_array_equal(aloha[frame_of(2, 9)]["image"][camera], stored)


def test_state_and_action_chunk_are_normalized_and_padded(aloha: LeRobotDataset) -> None:
    stats = aloha.norm_stats
    sample = aloha[frame_of(0, 0)]
    np.testing.assert_allclose(sample["state"][:14], stats.normalize_state(hm.frame_state(0, 0)), rtol=1e-6)
    expected = np.stack([hm.frame_action(0, f) for f in range(6)])
    np.testing.assert_allclose(sample["actions"][:, :14], stats.normalize_actions(expected), rtol=1e-6)
    assert not sample["action_is_pad"].any()


def test_the_chunk_repeats_the_last_action_past_the_episode_end(aloha: LeRobotDataset) -> None:
    last = hm.LENGTHS[0] - 1  # episode 0 has 7 frames: 0..6
    sample = aloha[frame_of(0, last - 2)]
    raw = np.stack([hm.frame_action(0, f) for f in (4, 5, 6, 6, 6, 6)])
    np.testing.assert_allclose(sample["actions"][:, :14], aloha.norm_stats.normalize_actions(raw), rtol=1e-6)
    np.testing.assert_array_equal(sample["action_is_pad"], [False, False, False, True, True, True])
    final = aloha[frame_of(0, last)]
    np.testing.assert_array_equal(final["action_is_pad"], [False] + [True] * 5)


def test_each_frame_has_its_own_task_as_prompt(aloha: LeRobotDataset) -> None:
    switch = hm.LENGTHS[3] // 2
    assert aloha[frame_of(3, switch - 1)]["prompt"] == hm.TASKS[0]
    assert aloha[frame_of(3, switch)]["prompt"] == hm.TASKS[2]
    assert aloha[frame_of(1, 0)]["prompt"] == hm.TASKS[1]


def test_episodes_of_frames_for_held_out_splits(aloha: LeRobotDataset) -> None:
    assert aloha.episode_of(0) == 0
    assert aloha.episode_of(frame_of(3, 39)) == 3
    assert aloha.episode_of(-1) == 4
    frames = aloha.indices_of_episodes([3, 1])
    assert frames.tolist() == list(range(frame_of(1, 0), frame_of(2, 0))) + list(
        range(frame_of(3, 0), frame_of(4, 0))
    )
    assert {aloha.episode_of(i) for i in frames} == {1, 3}
    with pytest.raises(ConfigError, match="has no episode 9"):
        aloha.indices_of_episodes([9])
    with pytest.raises(IndexError):
        aloha[len(aloha)]


def test_cameras_can_be_mapped_and_the_rest_are_absent(handmade: Path, cache_dir: Path) -> None:
    dataset = open_dataset(
        str(handmade), cameras={"left_wrist_0_rgb": "observation.images.cam_high"}, cache_dir=cache_dir
    )
    sample = dataset[3]
    assert list(sample["image"]) == ["left_wrist_0_rgb"]
    assert sample["image"]["left_wrist_0_rgb"].shape == (48, 64, 3)


def test_unknown_cameras_list_the_valid_ones(handmade: Path, cache_dir: Path) -> None:
    with pytest.raises(DatasetError) as caught:
        open_dataset(str(handmade), cameras={"base_0_rgb": "observation.images.top"}, cache_dir=cache_dir)
    assert "'observation.images.top', which is not an image feature of the dataset" in caught.value.problem
    assert "observation.images.cam_high, observation.images.cam_left_wrist" in caught.value.problem
    with pytest.raises(ConfigError, match="unknown model camera 'top'; valid model cameras: base_0_rgb"):
        open_dataset(str(handmade), cameras={"top": "observation.images.cam_high"}, cache_dir=cache_dir)


def test_the_index_is_built_once_and_rebuilt_when_the_data_changes(broken: Path, cache_dir: Path) -> None:
    first = open_dataset(str(broken), cache_dir=cache_dir)
    [index] = [p for p in (cache_dir / "frames").iterdir() if p.is_dir()]
    built = index.stat().st_mtime_ns
    again = open_dataset(f"file://{broken}", cache_dir=cache_dir)
    assert again.name == f"file://{broken}"
    assert [p for p in (cache_dir / "frames").iterdir() if p.is_dir()] == [index]
    assert index.stat().st_mtime_ns == built
    path = episode_file(broken, 0)
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 5), path)
    with pytest.raises(DatasetError, match=r"episode_000000\.parquet has 5 rows"):
        open_dataset(str(broken), cache_dir=cache_dir)
    assert len(first) > 0


def _collate(samples: list[Sample]) -> list[Sample]:
    return samples


def test_a_dataloader_with_worker_processes_reads_the_same_samples(synthetic: Path, cache_dir: Path) -> None:
    dataset = open_dataset(str(synthetic), cache_dir=cache_dir)
    assert len(pickle.dumps(dataset)) < 20_000  # no frames travel to the workers
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=4, num_workers=2, collate_fn=_collate, multiprocessing_context="spawn"
    )
    seen = [sample for batch in loader for sample in batch]
    assert len(seen) == len(dataset)
    for i in (0, 7, len(dataset) - 1):
        expected = dataset[i]
        assert seen[i]["prompt"] == expected["prompt"]
        np.testing.assert_array_equal(seen[i]["actions"], expected["actions"])
        assert list(seen[i]["image"]) == ["base_0_rgb", "left_wrist_0_rgb"]
        for camera in expected["image"]:
            np.testing.assert_array_equal(seen[i]["image"][camera], expected["image"][camera])


def test_a_corrupt_frame_is_named(broken: Path, cache_dir: Path) -> None:
    dataset = open_dataset(str(broken), cache_dir=cache_dir)
    [index] = [p for p in (cache_dir / "frames").iterdir() if p.is_dir()]
    data = index / "images" / "observation.images.top.bin"
    os.chmod(data, 0o644)
    data.write_bytes(b"\0" * data.stat().st_size)
    with pytest.raises(
        DatasetError, match=r"episode 0, frame 2: observation.images.top is not a readable image"
    ):
        dataset[2]


def test_a_build_killed_midway_leaves_nothing_behind(synthetic: Path, cache_dir: Path) -> None:
    key = fingerprint(require_meta(synthetic, "synthetic"))
    stale = cache_dir / "frames" / f".{key}.killed"
    (stale / "images").mkdir(parents=True)
    (stale / "images" / "observation.images.top.bin").write_bytes(b"half written")
    dataset = open_dataset(str(synthetic), cache_dir=cache_dir)
    assert not stale.exists()
    assert sorted(p.name for p in (cache_dir / "frames").iterdir() if p.is_dir()) == [key]
    assert dataset[0]["image"]["base_0_rgb"].shape == (32, 32, 3)
