"""Relay reads a dataset lerobot wrote as lerobot reads it: tests/fixtures/lerobot-v3-video is a
LeRobot v3.0 video dataset written by lerobot 0.6.1's own writer, and expected/ holds what lerobot's
`LeRobotDataset` returned for every frame (tests/fixtures/make_lerobot_datasets.py made both, in
lerobot's own environment). For every index, Relay's sample must carry the same state, action chunk,
padding flags, task and camera pixels.

Relay's samples are normalized (and padded to the model's width of 32); lerobot's are in dataset
units. So lerobot's values go through the same `NormStats` the Relay dataset uses, and the results
must be equal exactly, as must the zero padding.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from relay.catalog import ACTION_HORIZON, STATE_DIM
from relay_engine.datasets import LeRobotDataset, open_dataset
from relay_engine.samples import Sample

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot-v3-video"
EXPECTED = dict(np.load(FIXTURE / "expected" / "samples.npz"))
META = json.loads((FIXTURE / "expected" / "meta.json").read_text())
CAMERAS = {"base_0_rgb": "observation.images.top", "left_wrist_0_rgb": "observation.images.wrist"}
FRAMES = len(EXPECTED["index"])


@pytest.fixture(scope="module", params=["decoded at open", "decoded per sample"])
def relay(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LeRobotDataset:
    """Both ways Relay reads a video camera: every frame decoded once into the frame index (a
    dataset that fits the cache's limit), and each sample's frame decoded from the mp4 (one that
    does not: a limit of 0 turns the first off)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "decoded per sample":
            patch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", "0")
        dataset = open_dataset(str(FIXTURE), cameras=CAMERAS, cache_dir=tmp_path_factory.mktemp("cache"))
    assert bool(dataset._index.decoded) == (request.param == "decoded at open")
    return dataset


@pytest.fixture(scope="module")
def samples(relay: LeRobotDataset) -> list[Sample]:
    return [relay[i] for i in range(len(relay))]


def test_the_fixture_is_what_it_is_meant_to_be() -> None:
    """lerobot read it as Relay reads: its PyAV decoding, its tolerance, Relay's horizon; and the
    files lerobot wrote hold episode boundaries inside mp4 files."""
    assert META["read_with"]["video_backend"] == "pyav"
    assert META["read_with"]["tolerance_s"] == 1e-4
    assert META["action_horizon"] == ACTION_HORIZON
    assert EXPECTED["action"].shape[1] == ACTION_HORIZON
    assert json.loads((FIXTURE / "meta/info.json").read_text())["codebase_version"] == "v3.0"
    for feature in CAMERAS.values():
        files = [tuple(pair) for pair in META["layout"][feature]]
        assert len(set(files)) < len(files) and len(set(files)) > 1, files
    assert len({episode["length"] for episode in META["episodes"]}) == len(META["episodes"])
    assert list(EXPECTED["index"]) == list(range(FRAMES))


def test_frames_episodes_and_cameras_are_lerobots(relay: LeRobotDataset) -> None:
    summary = relay.summary
    assert len(relay) == FRAMES
    assert (summary.episodes, summary.fps) == (len(META["episodes"]), META["fps"])
    assert summary.cameras == {feature: tuple(size) for feature, size in META["cameras"].items()}
    assert (summary.state_dim, summary.action_dim) == (
        EXPECTED["observation.state"].shape[1],
        EXPECTED["action"].shape[2],
    )
    assert [relay.episode_of(i) for i in range(FRAMES)] == EXPECTED["episode_index"].tolist()


def test_states_are_lerobots(relay: LeRobotDataset, samples: list[Sample]) -> None:
    width = relay.summary.state_dim
    for i, sample in enumerate(samples):
        expected = np.zeros(STATE_DIM, dtype=np.float32)
        expected[:width] = relay.norm_stats.normalize_state(EXPECTED["observation.state"][i])
        np.testing.assert_array_equal(sample["state"], expected, err_msg=f"index {i}")


def test_action_chunks_and_padding_are_lerobots(relay: LeRobotDataset, samples: list[Sample]) -> None:
    width = relay.summary.action_dim
    for i, sample in enumerate(samples):
        expected = np.zeros_like(sample["actions"])
        expected[:, :width] = relay.norm_stats.normalize_actions(EXPECTED["action"][i])
        np.testing.assert_array_equal(sample["actions"], expected, err_msg=f"index {i}")
        np.testing.assert_array_equal(
            sample["action_is_pad"], EXPECTED["action_is_pad"][i], err_msg=f"index {i}"
        )
    # The fixture has chunks that run past their episode's end, and ones that do not.
    assert EXPECTED["action_is_pad"].any() and not EXPECTED["action_is_pad"].all(axis=1).any()
    assert not EXPECTED["action_is_pad"][:, 0].any()


def test_tasks_are_lerobots(samples: list[Sample]) -> None:
    assert [sample["prompt"] for sample in samples] == META["tasks"]
    assert len(set(META["tasks"])) == 2


def test_pixels_are_lerobots(samples: list[Sample]) -> None:
    """Identical, with no tolerance: both decode the same AV1 stream with PyAV's libdav1d (AV1
    decoding is bit-exact by the standard) and convert it to RGB with FFmpeg's rgb24 conversion. That
    held across PyAV versions: lerobot's 15.1 (FFmpeg libavcodec 61) wrote expected/, Relay's 18.1
    (libavcodec 62) matched every pixel. A wrong frame would not pass as rounding either: consecutive
    frames of an episode differ by at least 57 in some pixel (the square moves 2-3 pixels a frame)."""
    differences = []
    for camera, feature in CAMERAS.items():
        ours = np.stack([sample["image"][camera] for sample in samples])
        theirs = EXPECTED[feature]
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.uint8, (camera, ours.shape)
        error = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
        if error.any():
            worst = error.reshape(len(samples), -1).max(axis=1)
            differences.append(
                f"{feature}: largest difference {int(error.max())} (in 0..255), {int((error > 0).sum())} of "
                f"{error.size} values differ, in indices {np.flatnonzero(worst).tolist()}"
            )
    assert not differences, "; ".join(differences)


def test_stats_says_how_far_lerobots_quantiles_are_from_the_exact_ones(tmp_path: Path) -> None:
    """lerobot's meta/stats.json quantiles are per-episode histogram estimates averaged over the
    episodes; Relay normalizes with exact ones, and `relay datasets stats` says how far apart they are."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from relay.cli import app

    files = sorted((FIXTURE / "data").rglob("*.parquet"))
    table = pq.read_table(files, columns=["observation.state", "action"])
    lerobot_stats = json.loads((FIXTURE / "meta" / "stats.json").read_text())
    gap = 0.0
    for key in ("observation.state", "action"):
        values = np.asarray(table.column(key).to_pylist(), dtype=np.float64)
        exact = {q: np.quantile(values, float(q[1:]) / 100, axis=0) for q in ("q01", "q99")}
        span = np.maximum(exact["q99"] - exact["q01"], 1e-6)
        for q in ("q01", "q99"):
            gap = max(gap, float(np.max(np.abs(np.asarray(lerobot_stats[key][q]) - exact[q]) / span)))
    assert gap > 0.1  # far apart on this fixture: its four episodes cover different ranges
    result = CliRunner().invoke(app, ["datasets", "stats", str(FIXTURE), "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"differ from these by up to {gap:.1%} of the q01..q99 span" in " ".join(result.output.split())
