"""Relay reads a dataset lerobot wrote as lerobot reads it, in both LeRobot layouts Relay reads:

- tests/fixtures/lerobot-v3-video: LeRobot v3.0, written by lerobot 0.6.1's own writer
  (tests/fixtures/make_lerobot_datasets.py), episodes sharing mp4 and parquet files;
- tests/fixtures/lerobot-v21-video: LeRobot v2.1, written by lerobot 0.3.3's own writer, the last
  that writes v2.1 (tests/fixtures/make_lerobot_v21_dataset.py), one mp4 per episode and camera.

Each one's expected/ holds what that lerobot's own `LeRobotDataset` returned for every frame (its
script made both, in lerobot's own environment). Every check here runs on both: for every index,
Relay's sample must carry the same state, action chunk, padding flags, task and camera pixels.

Relay's samples are normalized (and padded to the model's width of 32); lerobot's are in dataset
units. So lerobot's values go through the same `NormStats` the Relay dataset uses, and the results
must be equal exactly, as must the zero padding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relay.catalog import ACTION_HORIZON, STATE_DIM
from relay_engine.datasets import LeRobotDataset, open_dataset
from relay_engine.samples import Sample

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# codebase_version -> the lerobot-written fixture in that layout.
WRITTEN = {"v3.0": FIXTURES / "lerobot-v3-video", "v2.1": FIXTURES / "lerobot-v21-video"}
CAMERAS = {"base_0_rgb": "observation.images.top", "left_wrist_0_rgb": "observation.images.wrist"}


@dataclass(frozen=True)
class Written:
    """A lerobot-written fixture and what lerobot's reader returned for it."""

    version: str
    path: Path
    expected: dict[str, np.ndarray]
    meta: dict[str, Any]

    @property
    def frames(self) -> int:
        return len(self.expected["index"])


@pytest.fixture(scope="module", params=list(WRITTEN))
def lerobot(request: pytest.FixtureRequest) -> Written:
    path = WRITTEN[request.param]
    return Written(
        version=request.param,
        path=path,
        expected=dict(np.load(path / "expected" / "samples.npz")),
        meta=json.loads((path / "expected" / "meta.json").read_text()),
    )


@pytest.fixture(scope="module", params=["decoded at open", "decoded per sample"])
def relay(
    request: pytest.FixtureRequest, lerobot: Written, tmp_path_factory: pytest.TempPathFactory
) -> LeRobotDataset:
    """Both ways Relay reads a video camera: every frame decoded once into the frame index (a
    dataset that fits the cache's limit), and each sample's frame decoded from the mp4 (one that
    does not: a limit of 0 turns the first off)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "decoded per sample":
            patch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", "0")
        dataset = open_dataset(str(lerobot.path), cameras=CAMERAS, cache_dir=tmp_path_factory.mktemp("cache"))
    assert bool(dataset._index.decoded) == (request.param == "decoded at open")
    return dataset


@pytest.fixture(scope="module")
def samples(relay: LeRobotDataset) -> list[Sample]:
    return [relay[i] for i in range(len(relay))]


def test_the_fixture_is_what_it_is_meant_to_be(lerobot: Written) -> None:
    """lerobot read it as Relay reads: its PyAV decoding, its tolerance, Relay's horizon; the files
    lerobot wrote are in the layout the fixture is for (v3.0: episode boundaries inside mp4 files;
    v2.1: one mp4 per episode and camera); and one episode is shorter than the action horizon."""
    meta, expected = lerobot.meta, lerobot.expected
    assert meta["read_with"]["video_backend"] == "pyav"
    assert meta["read_with"]["tolerance_s"] == 1e-4
    assert meta["action_horizon"] == ACTION_HORIZON
    assert expected["action"].shape[1] == ACTION_HORIZON
    info = json.loads((lerobot.path / "meta/info.json").read_text())
    assert info["codebase_version"] == lerobot.version
    lengths = [episode["length"] for episode in meta["episodes"]]
    assert len(set(lengths)) == len(lengths) and min(lengths) < ACTION_HORIZON
    assert list(expected["index"]) == list(range(lerobot.frames))
    if lerobot.version == "v3.0":
        assert meta["read_with"]["return_uint8"]
        for feature in CAMERAS.values():
            files = [tuple(pair) for pair in meta["layout"][feature]]
            assert len(set(files)) < len(files) and len(set(files)) > 1, files
    else:
        # lerobot 0.3.3 returns floats only: expected/ holds them as uint8, checked to be k / 255.
        assert not meta["read_with"]["return_uint8"]
        assert meta["read_with"]["largest_distance_of_x_times_255_from_an_integer"] < 1e-4
        mp4s = sorted(str(path.relative_to(lerobot.path)) for path in lerobot.path.rglob("*.mp4"))
        per_camera = [meta["layout"][feature] for feature in CAMERAS.values()]
        assert all(len(set(files)) == len(lengths) for files in per_camera), per_camera
        assert mp4s == sorted(file for files in per_camera for file in files), mp4s


def test_frames_episodes_and_cameras_are_lerobots(relay: LeRobotDataset, lerobot: Written) -> None:
    meta, expected = lerobot.meta, lerobot.expected
    summary = relay.summary
    assert len(relay) == lerobot.frames
    assert (summary.episodes, summary.fps) == (len(meta["episodes"]), meta["fps"])
    assert summary.cameras == {feature: tuple(size) for feature, size in meta["cameras"].items()}
    assert (summary.state_dim, summary.action_dim) == (
        expected["observation.state"].shape[1],
        expected["action"].shape[2],
    )
    assert [relay.episode_of(i) for i in range(lerobot.frames)] == expected["episode_index"].tolist()


def test_states_are_lerobots(relay: LeRobotDataset, samples: list[Sample], lerobot: Written) -> None:
    width = relay.summary.state_dim
    for i, sample in enumerate(samples):
        expected = np.zeros(STATE_DIM, dtype=np.float32)
        expected[:width] = relay.norm_stats.normalize_state(lerobot.expected["observation.state"][i])
        np.testing.assert_array_equal(sample["state"], expected, err_msg=f"index {i}")


def test_action_chunks_and_padding_are_lerobots(
    relay: LeRobotDataset, samples: list[Sample], lerobot: Written
) -> None:
    width = relay.summary.action_dim
    is_pad = lerobot.expected["action_is_pad"]
    for i, sample in enumerate(samples):
        expected = np.zeros_like(sample["actions"])
        expected[:, :width] = relay.norm_stats.normalize_actions(lerobot.expected["action"][i])
        np.testing.assert_array_equal(sample["actions"], expected, err_msg=f"index {i}")
        np.testing.assert_array_equal(sample["action_is_pad"], is_pad[i], err_msg=f"index {i}")
    # The fixture has chunks that run past their episode's end, and ones that do not.
    assert is_pad.any() and not is_pad.all(axis=1).any()
    assert not is_pad[:, 0].any()


def test_tasks_are_lerobots(samples: list[Sample], lerobot: Written) -> None:
    assert [sample["prompt"] for sample in samples] == lerobot.meta["tasks"]
    assert len(set(lerobot.meta["tasks"])) == 2


def test_pixels_are_lerobots(samples: list[Sample], lerobot: Written) -> None:
    """Identical, with no tolerance, on both fixtures: Relay and lerobot decode the same AV1 stream
    with PyAV's libdav1d (AV1 decoding is bit-exact by the standard) and convert it to RGB with
    FFmpeg's rgb24 conversion (Relay's `to_ndarray(format="rgb24")`; lerobot 0.3.3's pyav backend,
    torchvision's `VideoReader`, calls `to_rgb()`, the same conversion). That held across PyAV
    versions: lerobot's 15.1 (FFmpeg libavcodec 61) wrote both expected/, Relay's 18.1 (libavcodec
    62) matched every pixel. lerobot 0.3.3's float output is kept as uint8 only where it was exactly
    k / 255 (its script checks every value), so nothing is lost there either. A wrong frame would
    not pass as rounding: consecutive frames of an episode differ by at least 57 in some pixel (the
    square moves 2-3 pixels a frame; the smallest such difference is 57 in the v3.0 fixture and 94
    in the v2.1 one)."""
    expected = lerobot.expected
    differences = []
    for camera, feature in CAMERAS.items():
        ours = np.stack([sample["image"][camera] for sample in samples])
        theirs = expected[feature]
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.uint8, (camera, ours.shape)
        error = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
        if error.any():
            worst = error.reshape(len(samples), -1).max(axis=1)
            differences.append(
                f"{feature}: largest difference {int(error.max())} (in 0..255), {int((error > 0).sum())} of "
                f"{error.size} values differ, in indices {np.flatnonzero(worst).tolist()}"
            )
        same_episode = expected["episode_index"][1:] == expected["episode_index"][:-1]
        step = np.abs(theirs[1:].astype(np.int16) - theirs[:-1].astype(np.int16))
        assert step.reshape(len(step), -1).max(axis=1)[same_episode].min() >= 57, feature
    assert not differences, "; ".join(differences)


def test_stats_says_how_far_lerobots_quantiles_are_from_the_exact_ones(
    lerobot: Written, tmp_path: Path
) -> None:
    """lerobot's meta/stats.json quantiles (v3.0) are per-episode histogram estimates averaged over
    the episodes; Relay normalizes with exact ones, and `relay datasets stats` says how far apart
    they are. A v2.1 dataset has no meta/stats.json (lerobot 0.3.3 writes per-episode
    meta/episodes_stats.jsonl, without quantiles), and the command says nothing about one."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from relay.cli import app

    args = ["datasets", "stats", str(lerobot.path), "--cache-dir", str(tmp_path)]
    if lerobot.version == "v2.1":
        assert not (lerobot.path / "meta" / "stats.json").exists()
        episode_stats = (lerobot.path / "meta" / "episodes_stats.jsonl").read_text().splitlines()
        assert not any("q01" in json.loads(line)["stats"]["action"] for line in episode_stats)
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "q01..q99 span" not in " ".join(result.output.split()), result.output
        return
    files = sorted((lerobot.path / "data").rglob("*.parquet"))
    table = pq.read_table(files, columns=["observation.state", "action"])
    lerobot_stats = json.loads((lerobot.path / "meta" / "stats.json").read_text())
    gap = 0.0
    for key in ("observation.state", "action"):
        values = np.asarray(table.column(key).to_pylist(), dtype=np.float64)
        exact = {q: np.quantile(values, float(q[1:]) / 100, axis=0) for q in ("q01", "q99")}
        span = np.maximum(exact["q99"] - exact["q01"], 1e-6)
        for q in ("q01", "q99"):
            gap = max(gap, float(np.max(np.abs(np.asarray(lerobot_stats[key][q]) - exact[q]) / span)))
    assert gap > 0.1  # far apart on this fixture: its four episodes cover different ranges
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"differ from these by up to {gap:.1%} of the q01..q99 span" in " ".join(result.output.split())
