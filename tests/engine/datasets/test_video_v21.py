"""LeRobot v2.1 datasets with video cameras: one mp4 per episode and camera (`video_path` with
`{episode_index}`), the layout lerobot 0.3 wrote and many datasets on the Hub still have.

test_video_v3.py reads every sample of a v2.1 video dataset against the PNG dataset of the same
seed (lossy H.264, and `LOSSLESS_H264` within 1). This file covers what only the per-episode layout
goes through: `relay datasets check` decoding every frame of every episode's own mp4, an episode
whose mp4 is shorter than its rows, and forked loader workers opening one decoder per episode file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.datasets import open_dataset
from relay_engine.datasets.image_check import decode_every_image
from relay_engine.datasets.meta import require_meta
from relay_engine.datasets.synth import write_synthetic_dataset
from relay_engine.datasets.video import LOSSLESS_H264
from relay_engine.errors import DatasetError

CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (24, 32)}


def relay(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["datasets", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def mp4(root: Path, camera: str, episode: int) -> Path:
    return root / f"videos/chunk-000/{camera}/episode_{episode:06d}.mp4"


def test_check_decodes_every_frame_of_each_episodes_mp4(tmp_path: Path) -> None:
    out = tmp_path / "v21-video"
    code, output = relay("synth", out, "--episodes", "3", "--length", "6-10", "--video")
    assert code == 0, output
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v2.1"
    assert (
        info["video_path"] == "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    )
    cameras = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    assert cameras == ["observation.images.top", "observation.images.wrist"]
    assert all(mp4(out, camera, e).is_file() for camera in cameras for e in range(3))

    code, output = relay("check", out, "--cache-dir", tmp_path / "cache")
    assert code == 0, output
    assert "can be trained on" in output and "LeRobot v2.1" in output


def test_an_mp4_shorter_than_its_episode_is_named(tmp_path: Path) -> None:
    """Episode 1's mp4 replaced by one of 6 frames where its rows ask for 10: the frames past its
    end are named by check and by training, each episode's other frames still read."""
    root = write_synthetic_dataset(
        tmp_path / "long", episodes=3, episode_length=10, cameras=CAMERAS, video=True, seed=2
    )
    short = write_synthetic_dataset(
        tmp_path / "short", episodes=2, episode_length=6, cameras=CAMERAS, video=True, seed=2
    )
    shutil.copyfile(mp4(short, "observation.images.top", 1), mp4(root, "observation.images.top", 1))

    bad = decode_every_image(require_meta(root, "long"))
    assert sorted((b.episode, b.frame, b.camera) for b in bad) == [
        (1, frame, "observation.images.top") for frame in range(6, 10)
    ]
    assert "videos/chunk-000/observation.images.top/episode_000001.mp4 has no frame at 0.6 s" in str(bad[0])
    code, output = relay("check", root, "--cache-dir", tmp_path / "cache")
    assert code == 1 and "episode_000001.mp4" in output.replace("\n", "")

    dataset = open_dataset(str(root), cache_dir=tmp_path / "cache", action_horizon=5)
    first = int(dataset.indices_of_episodes([1])[0])
    assert dataset[first + 5]["image"]["base_0_rgb"].shape == (32, 32, 3)
    with pytest.raises(DatasetError) as caught:
        dataset[first + 6]
    assert "episode 1, frame 6: camera observation.images.top" in str(caught.value)
    dataset[int(dataset.indices_of_episodes([2])[-1])]  # the next episode's own mp4 reads on


def test_forked_loader_workers_read_the_parents_frames(tmp_path: Path) -> None:
    import torch.utils.data

    root = write_synthetic_dataset(
        tmp_path / "lossless",
        episodes=4,
        episode_length=(6, 12),
        cameras=CAMERAS,
        video=LOSSLESS_H264,
        seed=3,
    )
    images = write_synthetic_dataset(
        tmp_path / "images", episodes=4, episode_length=(6, 12), cameras=CAMERAS, seed=3
    )
    dataset = open_dataset(str(root), cache_dir=tmp_path / "cache", action_horizon=5)
    pngs = open_dataset(str(images), cache_dir=tmp_path / "cache", action_horizon=5)
    cameras = ("base_0_rgb", "left_wrist_0_rgb")
    expected = [{c: dataset[i]["image"][c] for c in cameras} for i in range(len(dataset))]  # decoders open
    for i, frames in enumerate(expected):
        for camera in cameras:  # yuv444p at qp 0: the PNGs' pixels, but for RGB <-> YUV rounding
            difference = frames[camera].astype(np.int16) - pngs[i]["image"][camera].astype(np.int16)
            assert np.abs(difference).max() <= 1, (i, camera)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context="fork", shuffle=False
    )
    seen = 0
    for i, sample in enumerate(loader):
        for camera in cameras:
            np.testing.assert_array_equal(np.asarray(sample["image"][camera]), expected[i][camera])
        seen += 1
    assert seen == len(dataset)
