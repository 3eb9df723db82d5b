"""Write a LeRobot dataset: v2.1 the way lerobot 0.3.x lays it out on disk, or v3.0 as lerobot 0.6.x
does; cameras as PNG images in the parquet files, or as mp4 video (PyAV).

v2.1: one parquet file per episode (PNG bytes in `struct<bytes, path>` columns, row groups of 100
rows as `datasets` writes image tables, the `huggingface` schema metadata with the `Sequence`
spelling that lerobot 0.3.x's `datasets<=3.6` can read), one mp4 per episode and camera, and the
four meta files: info.json, tasks.jsonl, episodes.jsonl and episodes_stats.jsonl.

v3.0: `episodes_per_file` episodes per data file and per mp4 (each episode's frames follow the
previous one's in the same encode, so its `from_timestamp` is its first frame's time), and the meta
files info.json, stats.json, tasks.parquet and episodes/chunk-000/file-000.parquet.

The synthetic maker and the benchmarks build on it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from relay_engine.datasets.video import VideoEncoder, VideoSettings
from relay_engine.errors import ConfigError

CODEBASE_VERSION = "v2.1"
V3 = "v3.0"
FORMATS = (CODEBASE_VERSION, V3)
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V3_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V3_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
CHUNKS_SIZE = 1000
# `datasets` writes image tables in batches of 100 rows; keep the same row groups.
ROW_GROUP_SIZE = 100
# lerobot samples at most about 100 frames per episode for image stats; a few dozen is plenty here.
IMAGE_STATS_SAMPLES = 24

_IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


@dataclass
class Episode:
    """One episode's frames: `state` (n, state_dim), `actions` (n, action_dim), per camera its
    frames as PNG bytes or as uint8 (H, W, 3) arrays."""

    task_index: int
    state: np.ndarray
    actions: np.ndarray
    images: Mapping[str, Sequence[bytes] | Sequence[np.ndarray]]


def encode_png(image: np.ndarray, compress_level: int = 6) -> bytes:
    """uint8 (H, W, 3) -> PNG bytes. PIL's default level, as lerobot's image writer uses."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


class DatasetWriter:
    """Writes episodes into a temporary directory beside `out_dir`, then moves it into place.

    `format` is "v2.1" or "v3.0"; `video` (None: PNG images) how cameras are encoded as mp4.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        fps: int,
        cameras: dict[str, tuple[int, int]],
        state_dim: int,
        action_dim: int,
        tasks: Sequence[str],
        robot_type: str = "unknown",
        overwrite: bool = False,
        format: str = CODEBASE_VERSION,
        video: VideoSettings | None = None,
        episodes_per_file: int = 1000,
    ) -> None:
        if format not in FORMATS:
            raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        if episodes_per_file < 1:
            raise ConfigError(f"episodes_per_file must be at least 1, got {episodes_per_file}")
        self.format = format
        self.video = video
        self.episodes_per_file = episodes_per_file
        self.out_dir = Path(out_dir).expanduser().absolute()
        if self.out_dir.exists() and any(self.out_dir.iterdir()) and not overwrite:
            raise ConfigError(f"{self.out_dir} already exists and is not empty")
        self.fps = fps
        self.cameras = dict(cameras)
        self.state_dim = state_dim
        self.action_dim = action_dim
        self.tasks = list(tasks)
        self.robot_type = robot_type
        self.overwrite = overwrite
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self._staging = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", dir=self.out_dir.parent))
        self._episodes: list[dict[str, object]] = []
        self._episode_stats: list[dict[str, object]] = []
        self._frames = 0
        self._video_info: dict[str, dict[str, object]] = {}
        # v3.0: the open data file and mp4s, and every frame's state and action for stats.json.
        self._data_writer: pq.ParquetWriter | None = None
        self._encoders: dict[str, VideoEncoder] = {}
        self._file_index = -1
        self._vectors: dict[str, list[np.ndarray]] = {"observation.state": [], "action": []}

    # -- episodes ---------------------------------------------------------------------------------

    def add_episode(self, episode: Episode) -> Path:
        """Write the episode's rows (in the staging directory); returns its data file."""
        episode_index = len(self._episodes)
        length = len(episode.state)
        self._check_episode(episode, length)
        frame_index = np.arange(length, dtype=np.int64)
        columns: dict[str, pa.Array] = {}
        if self.video is None:
            for camera in self.cameras:
                frames = [f if isinstance(f, bytes) else encode_png(f) for f in episode.images[camera]]
                columns[camera] = pa.array(
                    [{"bytes": png, "path": f"frame_{i:06d}.png"} for i, png in enumerate(frames)],
                    type=_IMAGE_TYPE,
                )
        columns["observation.state"] = _fixed_size_list(episode.state)
        columns["action"] = _fixed_size_list(episode.actions)
        numeric: dict[str, np.ndarray] = {
            "timestamp": (frame_index / self.fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(length, episode_index, dtype=np.int64),
            "index": np.arange(self._frames, self._frames + length, dtype=np.int64),
            "task_index": np.full(length, episode.task_index, dtype=np.int64),
        }
        columns.update({name: pa.array(values) for name, values in numeric.items()})
        table = pa.table(columns).replace_schema_metadata({"huggingface": json.dumps(self._hf_metadata())})
        row: dict[str, object] = {
            "episode_index": episode_index,
            "tasks": [self.tasks[episode.task_index]],
            "length": length,
        }
        if self.format == CODEBASE_VERSION:
            path = self._staging / DATA_PATH.format(
                episode_chunk=episode_index // CHUNKS_SIZE, episode_index=episode_index
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, path, row_group_size=ROW_GROUP_SIZE)
            if self.video is not None:
                for camera in self.cameras:
                    relative = VIDEO_PATH.format(
                        episode_chunk=episode_index // CHUNKS_SIZE,
                        video_key=camera,
                        episode_index=episode_index,
                    )
                    encoder = self._encoder(camera, self._staging / relative)
                    for image in episode.images[camera]:
                        encoder.add(_array(image))
                    self._close_encoder(camera)
        else:
            path = self._append_v3(episode, episode_index, table, row)
        stats: dict[str, object] = {camera: _image_stats(episode.images[camera]) for camera in self.cameras}
        stats["observation.state"] = _vector_stats(episode.state)
        stats["action"] = _vector_stats(episode.actions)
        stats.update({name: _vector_stats(values[:, None]) for name, values in numeric.items()})
        self._episode_stats.append({"episode_index": episode_index, "stats": stats})
        self._vectors["observation.state"].append(np.asarray(episode.state, dtype=np.float64))
        self._vectors["action"].append(np.asarray(episode.actions, dtype=np.float64))
        self._episodes.append(row)
        self._frames += length
        return path

    def _append_v3(
        self, episode: Episode, episode_index: int, table: pa.Table, row: dict[str, object]
    ) -> Path:
        """Append the episode to the current data file and mp4s (a new file every episodes_per_file)."""
        file_index = episode_index // self.episodes_per_file
        chunk_index, file_in_chunk = divmod(file_index, CHUNKS_SIZE)
        path = self._staging / V3_DATA_PATH.format(chunk_index=chunk_index, file_index=file_in_chunk)
        if file_index != self._file_index:
            self._close_v3_files()
            self._file_index = file_index
            path.parent.mkdir(parents=True, exist_ok=True)
            self._data_writer = pq.ParquetWriter(path, table.schema)
        assert self._data_writer is not None
        self._data_writer.write_table(table, row_group_size=ROW_GROUP_SIZE)
        row["data/chunk_index"], row["data/file_index"] = chunk_index, file_in_chunk
        row["dataset_from_index"], row["dataset_to_index"] = self._frames, self._frames + len(table)
        if self.video is not None:
            for camera in self.cameras:
                relative = V3_VIDEO_PATH.format(
                    video_key=camera, chunk_index=chunk_index, file_index=file_in_chunk
                )
                encoder = self._encoder(camera, self._staging / relative)
                start = encoder.frames
                for image in episode.images[camera]:
                    encoder.add(_array(image))
                row[f"videos/{camera}/chunk_index"] = chunk_index
                row[f"videos/{camera}/file_index"] = file_in_chunk
                row[f"videos/{camera}/from_timestamp"] = start / self.fps
                row[f"videos/{camera}/to_timestamp"] = encoder.frames / self.fps
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = 0, 0
        return path

    def _encoder(self, camera: str, path: Path) -> VideoEncoder:
        assert self.video is not None
        encoder = self._encoders.get(camera)
        if encoder is None:
            encoder = self._encoders[camera] = VideoEncoder(path, self.fps, self.cameras[camera], self.video)
        return encoder

    def _close_encoder(self, camera: str) -> None:
        encoder = self._encoders.pop(camera)
        found = encoder.close()
        height, width = self.cameras[camera]
        self._video_info.setdefault(
            camera,
            {
                "video.height": height,
                "video.width": width,
                "video.codec": found.codec,
                "video.pix_fmt": found.pix_fmt,
                "video.is_depth_map": False,
                "video.fps": self.fps,
                "video.channels": 3,
                "has_audio": False,
            },
        )

    def _close_v3_files(self) -> None:
        if self._data_writer is not None:
            self._data_writer.close()
            self._data_writer = None
        for camera in list(self._encoders):
            self._close_encoder(camera)

    def _check_episode(self, episode: Episode, length: int) -> None:
        if length == 0:
            raise ConfigError("an episode needs at least one frame")
        if episode.state.shape != (length, self.state_dim):
            raise ConfigError(f"state must be ({length}, {self.state_dim}), got {episode.state.shape}")
        if episode.actions.shape != (length, self.action_dim):
            raise ConfigError(f"actions must be ({length}, {self.action_dim}), got {episode.actions.shape}")
        if not 0 <= episode.task_index < len(self.tasks):
            raise ConfigError(f"task_index {episode.task_index} is not one of the {len(self.tasks)} tasks")
        for camera in self.cameras:
            if len(episode.images.get(camera, ())) != length:
                raise ConfigError(f"camera {camera} needs {length} frames")

    # -- meta ---------------------------------------------------------------------------------------

    def finish(self) -> Path:
        """Write the meta files and move the dataset into `out_dir`; returns it."""
        if not self._episodes:
            raise ConfigError("a dataset needs at least one episode")
        meta = self._staging / "meta"
        meta.mkdir(exist_ok=True)
        if self.format == CODEBASE_VERSION:
            (meta / "info.json").write_text(json.dumps(self._info(), indent=4, ensure_ascii=False))
            tasks = [{"task_index": i, "task": t} for i, t in enumerate(self.tasks)]
            _write_jsonl(meta / "tasks.jsonl", tasks)
            _write_jsonl(meta / "episodes.jsonl", self._episodes)
            _write_jsonl(meta / "episodes_stats.jsonl", self._episode_stats)
            (self._staging / "README.md").write_text(
                _DATASET_CARD.format(version=self._kind(CODEBASE_VERSION))
            )
        else:
            self._close_v3_files()
            (meta / "info.json").write_text(json.dumps(self._info_v3(), indent=4, ensure_ascii=False))
            (meta / "stats.json").write_text(json.dumps(self._stats(), indent=4))
            _write_tasks_parquet(meta / "tasks.parquet", self.tasks)
            episodes = meta / "episodes/chunk-000/file-000.parquet"
            episodes.parent.mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist(self._episodes), episodes)
            (self._staging / "README.md").write_text(_DATASET_CARD.format(version=self._kind(V3)))
        if self.out_dir.exists():
            if not self.overwrite and any(self.out_dir.iterdir()):
                raise ConfigError(f"{self.out_dir} already exists and is not empty")
            shutil.rmtree(self.out_dir)
        # mkdtemp made the staging directory for its owner alone (0700); the dataset is a directory
        # like any other the user makes, with the mode their umask gives one.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._staging, 0o777 & ~umask)
        os.replace(self._staging, self.out_dir)
        return self.out_dir

    def _kind(self, version: str) -> str:
        return f"{version} {'image' if self.video is None else 'video'}"

    def abort(self) -> None:
        with contextlib.suppress(Exception):  # the staging directory goes anyway
            self._close_v3_files()
        shutil.rmtree(self._staging, ignore_errors=True)

    def _features(self) -> dict[str, dict[str, object]]:
        features: dict[str, dict[str, object]] = {}
        for camera, (height, width) in self.cameras.items():
            if self.video is None:
                features[camera] = {
                    "dtype": "image",
                    "shape": [height, width, 3],
                    "names": ["height", "width", "channel"],
                }
            else:
                features[camera] = {
                    "dtype": "video",
                    "shape": [height, width, 3],
                    "names": ["height", "width", "channels"],
                    "info": self._video_info[camera],
                }
        features["observation.state"] = {
            "dtype": "float32",
            "shape": [self.state_dim],
            "names": [f"state_{i}" for i in range(self.state_dim)],
        }
        features["action"] = {
            "dtype": "float32",
            "shape": [self.action_dim],
            "names": [f"action_{i}" for i in range(self.action_dim)],
        }
        features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
        for name in ("frame_index", "episode_index", "index", "task_index"):
            features[name] = {"dtype": "int64", "shape": [1], "names": None}
        return features

    def _info(self) -> dict[str, object]:
        episodes = len(self._episodes)
        return {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": episodes,
            "total_frames": self._frames,
            "total_tasks": len(self.tasks),
            "total_videos": 0 if self.video is None else episodes * len(self.cameras),
            "total_chunks": (episodes - 1) // CHUNKS_SIZE + 1,
            "chunks_size": CHUNKS_SIZE,
            "fps": self.fps,
            "splits": {"train": f"0:{episodes}"},
            "data_path": DATA_PATH,
            "video_path": None if self.video is None else VIDEO_PATH,
            "features": self._features(),
        }

    def _info_v3(self) -> dict[str, object]:
        episodes = len(self._episodes)
        return {
            "codebase_version": V3,
            "robot_type": self.robot_type,
            "total_episodes": episodes,
            "total_frames": self._frames,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {"train": f"0:{episodes}"},
            "data_path": V3_DATA_PATH,
            "video_path": None if self.video is None else V3_VIDEO_PATH,
            "features": self._features(),
        }

    def _stats(self) -> dict[str, object]:
        """meta/stats.json: every feature's stats over the whole dataset (vectors with quantiles)."""
        stats: dict[str, object] = {}
        names = self._episode_stats[0]["stats"]
        assert isinstance(names, dict)
        for name in names:
            per_episode = [entry["stats"][name] for entry in self._episode_stats]  # type: ignore[index]
            stats[name] = _aggregate(per_episode)
        for name, parts in self._vectors.items():
            values = np.concatenate(parts)
            entry = _vector_stats(values)
            for q in QUANTILES:
                entry[f"q{round(q * 100):02d}"] = np.quantile(values, q, axis=0).tolist()
            stats[name] = entry
        return stats

    def _hf_metadata(self) -> dict[str, object]:
        features: dict[str, object] = (
            {camera: {"_type": "Image"} for camera in self.cameras} if self.video is None else {}
        )
        for name, width in (("observation.state", self.state_dim), ("action", self.action_dim)):
            features[name] = {
                "feature": {"dtype": "float32", "_type": "Value"},
                "length": width,
                "_type": "Sequence",
            }
        features["timestamp"] = {"dtype": "float32", "_type": "Value"}
        for name in ("frame_index", "episode_index", "index", "task_index"):
            features[name] = {"dtype": "int64", "_type": "Value"}
        return {"info": {"features": features}}


def _fixed_size_list(values: np.ndarray) -> pa.Array:
    flat = pa.array(np.ascontiguousarray(values, dtype=np.float32).reshape(-1))
    # pyarrow takes `type` in place of the list size; pyarrow-stubs' overloads leave it out.
    return pa.FixedSizeListArray.from_arrays(  # type: ignore[call-overload]
        flat, type=pa.list_(pa.field("element", pa.float32()), values.shape[1])
    )


def _vector_stats(values: np.ndarray) -> dict[str, list[float]]:
    values = np.asarray(values, dtype=np.float64)
    return {
        "min": values.min(axis=0).tolist(),
        "max": values.max(axis=0).tolist(),
        "mean": values.mean(axis=0).tolist(),
        "std": values.std(axis=0).tolist(),
        "count": [len(values)],
    }


def _array(image: bytes | np.ndarray) -> np.ndarray:
    return decode_png(image) if isinstance(image, bytes) else np.asarray(image, dtype=np.uint8)


def _aggregate(per_episode: list[dict[str, list[object]]]) -> dict[str, object]:
    """Episodes' stats pooled as lerobot aggregates them: count-weighted mean and variance."""
    counts = np.array([float(np.asarray(s["count"]).reshape(-1)[0]) for s in per_episode])
    means = np.stack([np.asarray(s["mean"], dtype=np.float64) for s in per_episode])
    stds = np.stack([np.asarray(s["std"], dtype=np.float64) for s in per_episode])
    weights = (counts / counts.sum()).reshape(-1, *([1] * (means.ndim - 1)))
    mean = (means * weights).sum(axis=0)
    variance = ((stds**2 + (means - mean) ** 2) * weights).sum(axis=0)
    return {
        "min": np.min(
            np.stack([np.asarray(s["min"], dtype=np.float64) for s in per_episode]), axis=0
        ).tolist(),
        "max": np.max(
            np.stack([np.asarray(s["max"], dtype=np.float64) for s in per_episode]), axis=0
        ).tolist(),
        "mean": mean.tolist(),
        "std": np.sqrt(variance).tolist(),
        "count": [int(counts.sum())],
    }


def _write_tasks_parquet(path: Path, tasks: Sequence[str]) -> None:
    """meta/tasks.parquet as lerobot writes it with pandas: task_index, indexed by the task string."""
    pandas = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    table = pa.table(
        {
            "task_index": pa.array(range(len(tasks)), type=pa.int64()),
            "task": pa.array(list(tasks), type=pa.string()),
        }
    ).replace_schema_metadata({"pandas": json.dumps(pandas)})
    pq.write_table(table, path)


def _image_stats(frames: Sequence[bytes] | Sequence[np.ndarray]) -> dict[str, list[object]]:
    """Per-channel stats in [0, 1], shape (3, 1, 1) as lerobot writes them, over evenly sampled frames."""
    picks = np.linspace(0, len(frames) - 1, min(len(frames), IMAGE_STATS_SAMPLES)).round().astype(int)
    pixels = np.stack([_array(frames[i]) for i in picks])
    channels = pixels.reshape(-1, 3)
    mean = channels.mean(axis=0, dtype=np.float64)
    # E[x^2] - E[x]^2 on uint8 data in float64 is exact enough and avoids a float copy of every pixel.
    square = np.einsum("ij,ij->j", channels, channels, dtype=np.float64) / len(channels)
    std = np.sqrt(np.maximum(square - mean**2, 0.0))

    def per_channel(values: np.ndarray) -> list[object]:
        return [[[float(v) / 255.0]] for v in values]

    return {
        "min": per_channel(channels.min(axis=0)),
        "max": per_channel(channels.max(axis=0)),
        "mean": per_channel(mean),
        "std": per_channel(std),
        "count": [len(picks)],
    }


def _write_jsonl(path: Path, rows: Sequence[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


_DATASET_CARD = """---
license: apache-2.0
task_categories:
- robotics
tags:
- LeRobot
configs:
- config_name: default
  data_files: data/*/*.parquet
---

A LeRobot {version} dataset written by Relay.
"""
