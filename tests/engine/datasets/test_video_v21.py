"""LeRobot v2.1 datasets with video cameras: one mp4 per episode and camera (`video_path` with
`{episode_index}`), the layout lerobot 0.3 wrote and many datasets on the Hub still have.

test_video_v3.py reads every sample of a v2.1 video dataset against the PNG dataset of the same
seed (lossy H.264, and `LOSSLESS_H264` within 1), both decoded at open and per sample, and names a
frame dropped from one; test_lerobot_fixtures.py reads the v2.1 dataset lerobot 0.3.3 wrote. Here:
`relay datasets check` passing what `relay datasets synth --video` writes, and forked loader
workers decoding per sample, which in v2.1 means a decoder per episode file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.datasets import open_dataset
from relay_engine.datasets.synth import write_synthetic_dataset
from relay_engine.datasets.video import LOSSLESS_H264

CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (24, 32)}


def relay(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["datasets", *map(str, args)], env={"COLUMNS": "300"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_check_passes_what_synth_video_writes_decoding_each_episodes_mp4(tmp_path: Path) -> None:
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
    for camera in cameras:
        assert sorted(p.name for p in (out / "videos/chunk-000" / camera).iterdir()) == [
            f"episode_{e:06d}.mp4" for e in range(3)
        ]

    code, output = relay("check", out, "--cache-dir", tmp_path / "cache")
    assert code == 0, output
    assert "can be trained on" in output and "│ format       │ LeRobot v2.1" in output
    assert "│ observation.images.top   │ video  │ 64 x 64        │ h264, yuv420p, 10 fps │" in output


def test_forked_loader_workers_decode_each_episodes_mp4_as_the_parent_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.utils.data

    root = write_synthetic_dataset(
        tmp_path / "lossless",
        episodes=4,
        episode_length=(6, 12),
        cameras=CAMERAS,
        video=LOSSLESS_H264,
        seed=3,
    )
    monkeypatch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", "0")  # decoded per sample, in each worker
    dataset = open_dataset(str(root), cache_dir=tmp_path / "cache", action_horizon=5)
    assert not dataset._index.decoded
    cameras = ("base_0_rgb", "left_wrist_0_rgb")
    # Every episode's mp4 opened in the parent first (read from the last frame back).
    expected = {i: {c: dataset[i]["image"][c] for c in cameras} for i in reversed(range(len(dataset)))}
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context="fork", shuffle=False
    )
    seen = 0
    for i, sample in enumerate(loader):
        for camera in cameras:
            np.testing.assert_array_equal(np.asarray(sample["image"][camera]), expected[i][camera])
        seen += 1
    assert seen == len(dataset)
