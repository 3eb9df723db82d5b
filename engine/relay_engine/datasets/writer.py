"""Write a LeRobot v2.1 image dataset, the way lerobot 0.3.x lays it out on disk.

One parquet file per episode (PNG bytes in `struct<bytes, path>` columns, row groups of 100 rows as
`datasets` writes image tables, the `huggingface` schema metadata with the `Sequence` spelling that
lerobot 0.3.x's `datasets<=3.6` can read) and the four meta files: info.json, tasks.jsonl,
episodes.jsonl and episodes_stats.jsonl. The synthetic maker and the benchmarks build on it.
"""

from __future__ import annotations

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

from relay_engine.errors import ConfigError

CODEBASE_VERSION = "v2.1"
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
CHUNKS_SIZE = 1000
# `datasets` writes image tables in batches of 100 rows; keep the same row groups.
ROW_GROUP_SIZE = 100
# lerobot samples at most about 100 frames per episode for image stats; a few dozen is plenty here.
IMAGE_STATS_SAMPLES = 24

_IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


@dataclass
class Episode:
    """One episode's frames: `state` (n, state_dim), `actions` (n, action_dim), PNG bytes per camera."""

    task_index: int
    state: np.ndarray
    actions: np.ndarray
    images: Mapping[str, Sequence[bytes]]


def encode_png(image: np.ndarray, compress_level: int = 6) -> bytes:
    """uint8 (H, W, 3) -> PNG bytes. PIL's default level, as lerobot's image writer uses."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


class DatasetWriter:
    """Writes episodes into a temporary directory beside `out_dir`, then moves it into place."""

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
    ) -> None:
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

    # -- episodes ---------------------------------------------------------------------------------

    def add_episode(self, episode: Episode) -> Path:
        """Write the episode's parquet file (in the staging directory); returns it."""
        episode_index = len(self._episodes)
        length = len(episode.state)
        self._check_episode(episode, length)
        frame_index = np.arange(length, dtype=np.int64)
        columns: dict[str, pa.Array] = {}
        for camera in self.cameras:
            frames = episode.images[camera]
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
        path = self._staging / DATA_PATH.format(
            episode_chunk=episode_index // CHUNKS_SIZE, episode_index=episode_index
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=ROW_GROUP_SIZE)

        stats: dict[str, object] = {camera: _image_stats(episode.images[camera]) for camera in self.cameras}
        stats["observation.state"] = _vector_stats(episode.state)
        stats["action"] = _vector_stats(episode.actions)
        stats.update({name: _vector_stats(values[:, None]) for name, values in numeric.items()})
        self._episode_stats.append({"episode_index": episode_index, "stats": stats})
        self._episodes.append(
            {"episode_index": episode_index, "tasks": [self.tasks[episode.task_index]], "length": length}
        )
        self._frames += length
        return path

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
        (meta / "info.json").write_text(json.dumps(self._info(), indent=4, ensure_ascii=False))
        _write_jsonl(meta / "tasks.jsonl", [{"task_index": i, "task": t} for i, t in enumerate(self.tasks)])
        _write_jsonl(meta / "episodes.jsonl", self._episodes)
        _write_jsonl(meta / "episodes_stats.jsonl", self._episode_stats)
        (self._staging / "README.md").write_text(_DATASET_CARD)
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

    def abort(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)

    def _features(self) -> dict[str, dict[str, object]]:
        features: dict[str, dict[str, object]] = {}
        for camera, (height, width) in self.cameras.items():
            features[camera] = {
                "dtype": "image",
                "shape": [height, width, 3],
                "names": ["height", "width", "channel"],
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
            "total_videos": 0,
            "total_chunks": (episodes - 1) // CHUNKS_SIZE + 1,
            "chunks_size": CHUNKS_SIZE,
            "fps": self.fps,
            "splits": {"train": f"0:{episodes}"},
            "data_path": DATA_PATH,
            "video_path": None,
            "features": self._features(),
        }

    def _hf_metadata(self) -> dict[str, object]:
        features: dict[str, object] = {camera: {"_type": "Image"} for camera in self.cameras}
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


def _image_stats(frames: Sequence[bytes]) -> dict[str, list[object]]:
    """Per-channel stats in [0, 1], shape (3, 1, 1) as lerobot writes them, over evenly sampled frames."""
    picks = np.linspace(0, len(frames) - 1, min(len(frames), IMAGE_STATS_SAMPLES)).round().astype(int)
    pixels = np.stack([np.asarray(Image.open(io.BytesIO(frames[i])).convert("RGB")) for i in picks])
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

A LeRobot v2.1 image dataset written by Relay.
"""
