"""LeRobot v3.0 datasets and video cameras (v2.1 and v3.0), written by our writer and read back.

Each variant holds the same synthetic content as a v2.1 image dataset (same seed), so every sample
must match it: state, action chunk, padding flags and prompt exactly, and pixels within the codec's
tolerance (lossy H.264 yuv420p), or exactly (H.264 RGB, lossless).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.datasets import inspect_dataset, open_dataset
from relay_engine.datasets.dataset import LeRobotDataset
from relay_engine.datasets.image_check import decode_every_image
from relay_engine.datasets.meta import require_meta
from relay_engine.datasets.synth import write_synthetic_dataset
from relay_engine.datasets.video import (
    LOSSLESS_H264,
    VideoEncoder,
    VideoFrames,
    VideoSettings,
    decode_in_order,
    encoder_available,
    realtime_threads,
)
from relay_engine.errors import DatasetError
from tests.engine.training.test_local_cli import local_train

CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (24, 32)}
CONTENT = {"episodes": 5, "episode_length": (6, 14), "cameras": CAMERAS, "num_tasks": 2, "seed": 3}
# Lossy H.264 (crf 23, yuv420p: chroma at half resolution) on 32x32 frames of flat colours with
# sharp edges: the mean absolute error per pixel and channel (0-255), over all frames and in the
# worst frame (measured: 6.6 and 10.1; the worst single pixels, at the dots' edges, are ~150 off).
LOSSY_MEAN_ABS = 8.0
LOSSY_WORST_FRAME_MEAN_ABS = 12.0
# H.264 yuv444p with qp=0: lossless coding, only the RGB <-> YUV rounding: at most 1 off.
YUV444_MAX_ABS = 1
# H.264 in RGB with qp=0 (libx264rgb): lossless, so the pixels are the PNGs' exactly.
LOSSLESS = VideoSettings(codec="libx264rgb", pix_fmt="rgb24", options=(("qp", "0"),))


def write(root: Path, **options: object) -> Path:
    return write_synthetic_dataset(root, **CONTENT, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("formats")
    return {
        "v2.1-images": write(base / "v21-images"),
        "v2.1-video": write(base / "v21-video", video=True),
        "v3.0-images": write(base / "v30-images", format="v3.0", episodes_per_file=2),
        "v3.0-video": write(base / "v30-video", format="v3.0", video=True, episodes_per_file=2),
        "v3.0-lossless": write(base / "v30-lossless", format="v3.0", video=LOSSLESS, episodes_per_file=3),
        "v2.1-yuv444": write(base / "v21-yuv444", video=LOSSLESS_H264),
    }


def open_it(root: Path, cache: Path) -> LeRobotDataset:
    return open_dataset(str(root), cache_dir=cache, action_horizon=5)


def assert_same_samples(reference: LeRobotDataset, other: LeRobotDataset, tolerance: str) -> None:
    assert len(other) == len(reference)
    assert other.summary.cameras == reference.summary.cameras
    assert other.summary.tasks == reference.summary.tasks
    assert other.episodes.tolist() == reference.episodes.tolist()
    errors = []
    for i in range(len(reference)):
        want, got = reference[i], other[i]
        np.testing.assert_array_equal(got["state"], want["state"])
        np.testing.assert_array_equal(got["actions"], want["actions"])
        np.testing.assert_array_equal(got["action_is_pad"], want["action_is_pad"])
        assert got["prompt"] == want["prompt"]
        assert other.episode_of(i) == reference.episode_of(i)
        for camera in want["image"]:
            assert got["image"][camera].shape == want["image"][camera].shape
            assert got["image"][camera].dtype == np.uint8
            difference = np.abs(
                got["image"][camera].astype(np.int16) - want["image"][camera].astype(np.int16)
            )
            if tolerance == "exact":
                assert difference.max() == 0, (i, camera)
            elif tolerance == "yuv444":
                assert difference.max() <= YUV444_MAX_ABS, (i, camera)
            errors.append(difference)
    if tolerance == "lossy":
        assert float(np.mean([e.mean() for e in errors])) <= LOSSY_MEAN_ABS
        assert max(float(e.mean()) for e in errors) <= LOSSY_WORST_FRAME_MEAN_ABS


@pytest.mark.parametrize(
    ("variant", "tolerance"),
    [
        ("v2.1-video", "lossy"),
        ("v2.1-yuv444", "yuv444"),
        ("v3.0-images", "exact"),
        ("v3.0-video", "lossy"),
        ("v3.0-lossless", "exact"),
    ],
)
def test_every_sample_matches_the_v21_image_dataset(
    made: dict[str, Path], tmp_path: Path, variant: str, tolerance: str
) -> None:
    if variant == "v3.0-lossless" and not encoder_available("libx264rgb"):
        pytest.fail("PyAV's FFmpeg has no libx264rgb encoder")
    reference = open_it(made["v2.1-images"], tmp_path / "cache")
    other = open_it(made[variant], tmp_path / "cache")
    assert_same_samples(reference, other, tolerance)


def test_v30_video_layout_has_episodes_sharing_files(made: dict[str, Path]) -> None:
    root = made["v3.0-video"]
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    top = info["features"]["observation.images.top"]
    assert top["dtype"] == "video"
    assert top["info"]["video.codec"] == "h264" and top["info"]["video.pix_fmt"] == "yuv420p"
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    lengths = [e["length"] for e in episodes]
    assert len(set(lengths)) > 1  # episodes of different lengths
    # Episodes 0 and 1 share file-000.mp4: episode 1 starts where episode 0 ends, inside the file.
    first, second, third = episodes[:3]
    key = "videos/observation.images.wrist"
    assert first[f"{key}/file_index"] == second[f"{key}/file_index"] == 0
    assert second[f"{key}/from_timestamp"] == pytest.approx(first[f"{key}/to_timestamp"])
    assert second[f"{key}/from_timestamp"] > 0
    assert third[f"{key}/file_index"] == 1 and third[f"{key}/from_timestamp"] == 0
    assert sorted(p.name for p in (root / "videos/observation.images.top/chunk-000").iterdir()) == [
        "file-000.mp4",
        "file-001.mp4",
        "file-002.mp4",
    ]
    assert pq.read_table(root / "meta/tasks.parquet").column("task").to_pylist() == [
        "move to the red dot",
        "move to the blue dot",
    ]
    stats = json.loads((root / "meta/stats.json").read_text())
    assert set(stats["observation.state"]) >= {"min", "max", "mean", "std", "count", "q01", "q99"}


def test_the_frame_at_an_episode_boundary_inside_one_mp4(made: dict[str, Path], tmp_path: Path) -> None:
    reference = open_it(made["v2.1-images"], tmp_path / "cache")
    lossless = open_it(made["v3.0-lossless"], tmp_path / "cache")
    boundary = int(lossless.indices_of_episodes([1])[0])  # episode 1's first frame, mid file-000
    for frame in (boundary - 1, boundary, boundary + 1):
        for camera in reference.camera_map:
            np.testing.assert_array_equal(lossless[frame]["image"][camera], reference[frame]["image"][camera])


def test_a_missing_mp4_is_refused_naming_the_camera(made: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(made["v3.0-video"], tmp_path / "missing"))
    (root / "videos/observation.images.wrist/chunk-000/file-001.mp4").unlink()
    problems = inspect_dataset(root, "missing").problems.messages()
    assert problems == [
        "camera observation.images.wrist: videos/observation.images.wrist/chunk-000/file-001.mp4 is missing"
    ]
    with pytest.raises(DatasetError) as caught:
        open_it(root, tmp_path / "cache")
    assert "camera observation.images.wrist" in str(caught.value)


def test_an_undecodable_mp4_is_refused_naming_the_camera_and_codec(
    made: dict[str, Path], tmp_path: Path
) -> None:
    root = Path(shutil.copytree(made["v2.1-video"], tmp_path / "broken"))
    path = root / "videos/chunk-000/observation.images.top/episode_000002.mp4"
    path.write_bytes(b"\0\0\0\x18ftypmp42" + bytes(range(256)) * 8)
    [problem] = inspect_dataset(root, "broken").problems.messages()
    assert problem.startswith(
        "camera observation.images.top: videos/chunk-000/observation.images.top/episode_000002.mp4 "
        "(codec h264 in meta/info.json) cannot be decoded"
    )
    with pytest.raises(DatasetError) as caught:
        open_it(root, tmp_path / "cache")
    assert "camera observation.images.top" in str(caught.value) and "codec h264" in str(caught.value)


def test_an_unknown_version_is_refused(made: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(made["v3.0-images"], tmp_path / "v4"))
    info = json.loads((root / "meta/info.json").read_text())
    info["codebase_version"] = "v4.0"
    (root / "meta/info.json").write_text(json.dumps(info))
    assert inspect_dataset(root, "v4").problems.messages() == [
        "meta/info.json: codebase_version is 'v4.0'; Relay reads LeRobot v2.1 and v3.0 datasets"
    ]


def test_a_v30_episode_table_without_file_indices_is_refused(made: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(made["v3.0-video"], tmp_path / "no-index"))
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["data/file_index"]), path)
    problems = inspect_dataset(root, "no-index").problems.messages()
    assert problems == [
        "meta/episodes/chunk-000/file-000.parquet has no column data/file_index",
        "meta/episodes/ lists no episodes",
    ]


def test_samples_pickle_to_another_process(made: dict[str, Path], tmp_path: Path) -> None:
    import pickle

    dataset = open_it(made["v3.0-video"], tmp_path / "cache")
    first = dataset[3]["image"]["base_0_rgb"]
    copy = pickle.loads(pickle.dumps(dataset))
    np.testing.assert_array_equal(copy[3]["image"]["base_0_rgb"], first)


def test_local_train_on_a_v30_video_dataset(made: dict[str, Path], tmp_path: Path) -> None:
    dataset = write_synthetic_dataset(
        tmp_path / "train-v30",
        episodes=4,
        episode_length=12,
        cameras={"observation.images.top": (32, 32)},
        format="v3.0",
        video=True,
        episodes_per_file=3,
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay.cli",
            *local_train(dataset, tmp_path / "out"),
            *("--batch-size", "2", "--steps", "3", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RELAY_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert {"step": 3, "event": "finished"} in lines
    assert lines[-1]["status"] == "completed"


def test_synth_cli_writes_v30_video(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay.cli",
            "datasets",
            "synth",
            str(out),
            "--episodes",
            "2",
            "--length",
            "5",
            "--format",
            "v3.0",
            "--video",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["features"]["observation.images.top"]["dtype"] == "video"
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay.cli",
            "datasets",
            "check",
            str(out),
            "--cache-dir",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "can be trained on" in checked.stdout


@pytest.mark.parametrize(
    ("settings", "codec"),
    [
        (VideoSettings(codec="hevc", options=(("crf", "23"), ("x265-params", "log-level=error"))), "hevc"),
        (VideoSettings(codec="av1", options=(("crf", "30"), ("preset", "12"))), "av1"),
    ],
)
def test_hevc_and_av1_cameras_decode(
    made: dict[str, Path], tmp_path: Path, settings: VideoSettings, codec: str
) -> None:
    root = write(tmp_path / codec, format="v3.0", video=settings, episodes_per_file=2)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"]["observation.images.top"]["info"]["video.codec"] == codec
    reference = open_it(made["v2.1-images"], tmp_path / "cache")
    assert_same_samples(reference, open_it(root, tmp_path / "cache"), "lossy")


def test_encoding_av1_leaves_no_thread_at_real_time_priority(tmp_path: Path) -> None:
    """SVT-AV1 run as root moves the encoding thread and its own to SCHED_FIFO 99; what the process
    starts afterwards (a test run's workers, a browser) would inherit it and starve the machine."""
    before = realtime_threads()
    encoder = VideoEncoder(
        tmp_path / "a.mp4", 10, (32, 32), VideoSettings(codec="av1", options=(("preset", "12"),))
    )
    for value in range(3):
        encoder.add(np.full((32, 32, 3), value * 60, np.uint8))
        assert realtime_threads() <= before, "the encoder left real-time threads"
    assert encoder.close().codec == "av1" and encoder.frames == 3
    assert realtime_threads() <= before and os.sched_getscheduler(0) == os.SCHED_OTHER


def test_a_frame_off_the_video_timeline_is_named(
    made: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(shutil.copytree(made["v3.0-video"], tmp_path / "shifted"))
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    rows = pq.read_table(path).to_pylist()
    rows[1]["videos/observation.images.top/from_timestamp"] += 0.05  # half a frame at 10 fps
    pq.write_table(pa.Table.from_pylist(rows), path)

    bad = decode_every_image(require_meta(root, "shifted"))
    assert {(b.episode, b.camera) for b in bad} == {(1, "observation.images.top")}
    frames = [b for b in bad if b.frame is not None]
    [span] = [b for b in bad if b.frame is None]
    # Episode 1 ends its file, so its last frame (half a frame past the video's last) is past the
    # video's end, named in the episode's line; each of the others has no frame within 1e-4 s.
    length = rows[1]["length"]
    assert [b.frame for b in frames] == list(range(length - 1))
    assert "videos/observation.images.top/chunk-000/file-000.mp4 has no frame at 1.35 s" in str(frames[0])
    assert f"before the episode's frame {length - 1} " in str(span)
    assert f"{length - 1} of its frames have no video frame within 0.0001 s of their time" in str(span)
    # Decoding every frame into the frame index at open finds it before training starts ...
    with pytest.raises(DatasetError) as at_open:
        open_it(root, tmp_path / "cache")
    assert "episode 1, frame 0: camera observation.images.top" in str(at_open.value)
    assert "file-000.mp4: no frame at 1.35 s within 0.0001 s" in str(at_open.value)
    # ... and a dataset too large for that names it when the sample is read.
    monkeypatch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", "0")
    dataset = open_it(root, tmp_path / "cache")
    frame = int(dataset.indices_of_episodes([1])[0])
    with pytest.raises(DatasetError) as caught:
        dataset[frame]
    assert "episode 1, frame 0: camera observation.images.top" in str(caught.value)
    assert "within 0.0001 s" in str(caught.value)


def test_forked_loader_workers_open_their_own_decoders(
    made: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.utils.data

    monkeypatch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", "0")  # decoded per sample, in each worker
    dataset = open_it(made["v3.0-video"], tmp_path / "cache")
    assert not dataset._index.decoded
    expected = [
        dataset[i]["image"]["left_wrist_0_rgb"] for i in range(len(dataset))
    ]  # parent's decoders open
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context="fork", shuffle=False
    )
    for i, sample in enumerate(loader):
        np.testing.assert_array_equal(np.asarray(sample["image"]["left_wrist_0_rgb"]), expected[i])


@pytest.mark.parametrize("variant", ["v3.0-video", "v2.1-video"])
def test_frames_decoded_at_open_are_the_frames_decoded_per_sample_in_any_order(
    made: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """The two ways a video camera is read give the same pixels: the frame index's copy, decoded
    once in order, and a decoder seeking per sample, in a shuffled order (so some queries seek and
    some decode on from the frame before) and then backwards."""
    decoded = open_it(made[variant], tmp_path / "cache")
    assert set(decoded._index.decoded) == set(decoded.summary.cameras)
    assert (decoded._index.directory / "decoded" / "complete.json").is_file()
    monkeypatch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", "0")
    per_sample = open_it(made[variant], tmp_path / "cache-per-sample")
    assert not per_sample._index.decoded
    order = np.random.default_rng(0).permutation(len(decoded)).tolist()
    order += sorted(order)[:12] + list(range(len(decoded) - 1, -1, -1))
    for i in order:
        for camera, image in per_sample[i]["image"].items():
            np.testing.assert_array_equal(decoded[i]["image"][camera], image, err_msg=f"{i} {camera}")


def test_decoding_into_the_cache_keeps_to_its_limit(
    made: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay_engine.datasets import decoded_frames

    probe_dataset = open_it(made["v3.0-video"], tmp_path / "probe")
    needed = decoded_frames.decoded_size(len(probe_dataset), probe_dataset.summary.cameras)
    assert sum(p.stat().st_size for p in (probe_dataset._index.directory / "decoded").glob("*.rgb")) == needed
    monkeypatch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", str(needed - 1))
    over = open_it(made["v3.0-video"], tmp_path / "over")
    assert not over._index.decoded and not (over._index.directory / "decoded").exists()
    over[0]  # decoded per sample
    monkeypatch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", str(needed))
    reopened = open_it(made["v3.0-video"], tmp_path / "over")  # the same index, now decoded into
    assert reopened._index.directory == over._index.directory and reopened._index.decoded
    monkeypatch.setenv("RELAY_VIDEO_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="bad RELAY_VIDEO_CACHE_MAX_BYTES: 'lots'"):
        open_it(made["v3.0-video"], tmp_path / "again")


def remux(path: Path, keep: Callable[[int], bool]) -> int:
    """Rewrite an mp4 with only the packets (frames, in decoding order) `keep` accepts, as a
    recording cut short or a dropped frame leaves it; the number of packets it had."""
    import av

    rewritten = path.with_suffix(".rewritten.mp4")
    count = 0
    with av.open(str(path)) as source, av.open(str(rewritten), "w") as target:
        stream = source.streams.video[0]
        out = target.add_stream_from_template(stream)
        for packet in source.demux(stream):
            if packet.dts is None:  # the flushing packet
                continue
            if keep(count):
                packet.stream = out
                target.mux(packet)
            count += 1
    rewritten.replace(path)
    return count


def check_cli(root: Path, cache: Path) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, ["datasets", "check", str(root), "--cache-dir", str(cache)], env={"COLUMNS": "300"}
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_check_shows_the_format_and_each_video_cameras_codec(made: dict[str, Path], tmp_path: Path) -> None:
    code, output = check_cli(made["v3.0-video"], tmp_path / "cache")
    assert code == 0, output
    assert "│ format       │ LeRobot v3.0" in output
    assert (
        "│ observation.images.top   │ video  │ 32 x 32        │ h264, yuv420p, 10 fps │ base_0_rgb" in output
    )
    assert (
        "│ observation.images.wrist │ video  │ 24 x 32        │ h264, yuv420p, 10 fps │ left_wrist_0_rgb"
        in output
    )
    code, output = check_cli(made["v2.1-images"], tmp_path / "cache")
    assert code == 0, output
    assert "│ format       │ LeRobot v2.1" in output
    assert "│ observation.images.top   │ image  │ 32 x 32" in output


def test_a_truncated_mp4_names_the_episode_it_cuts_short(made: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(made["v3.0-video"], tmp_path / "truncated"))
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    first, second = episodes[0]["length"], episodes[1]["length"]  # both in file-000.mp4
    relative = "videos/observation.images.top/chunk-000/file-000.mp4"
    assert remux(root / relative, lambda packet: packet < first + 2) == first + second
    meta = require_meta(root, "truncated")
    [span] = decode_every_image(meta)
    start = episodes[1]["videos/observation.images.top/from_timestamp"]
    assert (span.episode, span.frame, span.camera) == (1, None, "observation.images.top")
    assert str(span) == (
        f"episode 1, camera observation.images.top: {relative} holds 2 decodable frames from {start:.6g} s "
        f"to {start + (second - 1) / 10:.6g} s, where the episode has {second} rows; the video ends at "
        f"{start + 0.1:.6g} s, before the episode's frames 2 to {second - 1} (at {start + 0.2:.6g} s)"
    )
    code, output = check_cli(root, tmp_path / "cache")
    assert code == 1
    assert f"  - {span} (its frames without a video frame cannot be trained on)" in output
    # The probe of its first frame still passes: only decoding the episode's span shows it.
    assert inspect_dataset(root, "truncated").problems.messages() == []


def test_a_frame_dropped_mid_episode_is_named(made: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(made["v2.1-video"], tmp_path / "dropped"))
    relative = "videos/chunk-000/observation.images.wrist/episode_000002.mp4"
    length = remux(root / relative, lambda packet: packet != 3)  # a P-frame: the others still decode
    meta = require_meta(root, "dropped")
    assert next(e.length for e in meta.episodes if e.index == 2) == length
    bad = decode_every_image(meta)
    assert [(b.episode, b.frame, b.camera) for b in bad] == [
        (2, 3, "observation.images.wrist"),
        (2, None, "observation.images.wrist"),
    ]
    assert str(bad[0]).endswith(f"{relative} has no frame at 0.3 s (nearest 0.1 s away)")
    assert str(bad[1]) == (
        f"episode 2, camera observation.images.wrist: {relative} holds {length - 1} decodable frames "
        f"from 0 s to {(length - 1) / 10:.6g} s, where the episode has {length} rows; 1 of its frames "
        "has no video frame within 0.0001 s of its time"
    )
    code, output = check_cli(root, tmp_path / "cache")
    assert code == 1
    lines = [line for line in output.splitlines() if line.startswith("  - ")]
    assert lines == [
        f"  - {bad[1]} (its frames without a video frame cannot be trained on)",
        f"  - {bad[0]} (the frame cannot be trained on)",
    ]


@pytest.mark.parametrize("variant", ["v3.0-video", "v2.1-yuv444"])
def test_frames_kept_converter_gives_pyav_s_rgb(made: dict[str, Path], variant: str) -> None:
    """Relay converts frames to RGB through one kept FFmpeg scaling context per file (a new one per
    frame cost more than the decoding): the pixels are PyAV's `to_ndarray(format="rgb24")`, in
    order and at random times."""
    import av

    path = sorted(made[variant].rglob("*.mp4"))[0]
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        expected = [
            (float(frame.pts * stream.time_base), frame.to_ndarray(format="rgb24"))
            for frame in container.decode(stream)
            if frame.pts is not None and stream.time_base is not None
        ]
    in_order = list(decode_in_order(path, 0.0))
    assert [time for time, _ in in_order] == [time for time, _ in expected]
    for (_, image), (_, reference) in zip(in_order, expected, strict=True):
        np.testing.assert_array_equal(image, reference)
    frames = VideoFrames()
    for position in np.random.default_rng(0).permutation(len(expected)).tolist():
        time, reference = expected[position]
        np.testing.assert_array_equal(frames.frame(path, time), reference, err_msg=str(time))
