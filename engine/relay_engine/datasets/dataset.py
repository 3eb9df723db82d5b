"""Training samples from a LeRobot v2.1 or v3.0 dataset: `open_dataset(name) -> LeRobotDataset`.

A `LeRobotDataset` is a map-style dataset for `torch.utils.data.DataLoader`: `ds[i]` is frame i as
a `relay_engine.samples.Sample`, with images at the dataset's own size (the model's collator fits
them to its size) or, for a video camera decoded into the frame index, already fitted to the size
of the model the dataset was opened for (`image_fit`), the normalized state padded to 32, the
frame's task as the prompt and the chunk of the next `action_horizon` actions within the episode
(the last one repeated past the episode's end, and those steps marked in `action_is_pad`). It
reads each frame from the frame index with a few `pread`s, so it holds nothing of the dataset in
memory and pickles to worker processes cheaply. A video camera's frame was decoded into the frame
index, at the model's size, at the dataset's first open for that model, where the decoded frames
fit the cache's limit; otherwise it is decoded from the dataset's mp4 at the frame's time in it
(each process keeps its own decoder per file open).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, UnidentifiedImageError

from relay.catalog import ACTION_DIM, ACTION_HORIZON, MODEL_CAMERAS, STATE_DIM
from relay_engine.datasets.frame_index import FrameIndex, ensure_frame_index
from relay_engine.datasets.hub import DatasetSource, locate_dataset, resolve_dataset
from relay_engine.datasets.meta import require_meta
from relay_engine.datasets.norm_stats import NormalizationMethod, NormStats, compute_norm_stats
from relay_engine.datasets.summary import DatasetSummary
from relay_engine.datasets.validation import inspect_dataset
from relay_engine.datasets.video import VideoError, VideoFrames
from relay_engine.errors import ConfigError, DatasetError
from relay_engine.image_fit import ImageFit
from relay_engine.paths import cache_dir_or_default
from relay_engine.samples import Sample

# Where a dataset may ship its own statistics, in openpi's layout.
SHIPPED_NORM_STATS = ("norm_stats.json", "meta/norm_stats.json")


class LeRobotDataset:
    """Frames of one dataset as training samples; build it with `open_dataset`.

    `name`, `summary`, `norm_stats` (what the samples are normalized with), `camera_map` (model
    camera -> dataset feature), `action_horizon`, `source` (what was read: the Hub revision and
    commit, or the directory; None where the dataset was built without `open_dataset`); `len(ds)`
    frames; `ds[i]` a Sample.
    """

    def __init__(
        self,
        name: str,
        index: FrameIndex,
        norm_stats: NormStats,
        camera_map: dict[str, str],
        action_horizon: int,
        source: DatasetSource | None = None,
        root: Path | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.root = root  # where video cameras' mp4 files are read from
        self._video = VideoFrames()
        self.summary: DatasetSummary = replace(index.summary, name=name)
        self.norm_stats = norm_stats
        self.camera_map = camera_map
        self.action_horizon = action_horizon
        self._index = index

    def __len__(self) -> int:
        return self.summary.frames

    def __getitem__(self, frame: int) -> Sample:
        frame = self._check_frame(frame)
        position = self._episode_position(frame)
        actions, action_is_pad = self._action_chunk(frame, position)
        state = np.zeros(STATE_DIM, dtype=np.float32)
        state[: self.summary.state_dim] = self.norm_stats.normalize_state(self._index.state(frame))
        return Sample(
            image={
                camera: self._image(feature, frame, position) for camera, feature in self.camera_map.items()
            },
            state=state,
            state_dim=self.summary.state_dim,
            prompt=self.summary.tasks[self._index.task_index(frame)],
            actions=actions,
            action_dim=self.summary.action_dim,
            action_is_pad=action_is_pad,
        )

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """Every frame's state and action in the dataset's units (memory-mapped, read-only)."""
        return self._index.columns()

    def action_chunk(self, frame: int) -> tuple[np.ndarray, np.ndarray]:
        """Frame `frame`'s sample's ``actions`` and ``action_is_pad`` alone, read without its images
        (the blind baseline reads thousands)."""
        frame = self._check_frame(frame)
        return self._action_chunk(frame, self._episode_position(frame))

    def _action_chunk(self, frame: int, position: int) -> tuple[np.ndarray, np.ndarray]:
        episode_end = int(self._index.episode_start[position + 1])
        chunk_end = min(frame + self.action_horizon, episode_end)
        chunk = self._index.actions(frame, chunk_end)
        real_steps = len(chunk)
        if real_steps < self.action_horizon:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], self.action_horizon - real_steps, axis=0)])
        actions = np.zeros((self.action_horizon, ACTION_DIM), dtype=np.float32)
        actions[:, : self.summary.action_dim] = self.norm_stats.normalize_actions(chunk)
        return actions, np.arange(self.action_horizon) >= real_steps

    def episode_of(self, frame: int) -> int:
        """The dataset's episode_index of frame `frame`."""
        return int(self._index.episode_index[self._episode_position(self._check_frame(frame))])

    @property
    def episodes(self) -> np.ndarray:
        """The dataset's episode indices, in order."""
        return self._index.episode_index.copy()

    def indices_of_episodes(self, episodes: Iterable[int]) -> np.ndarray:
        """The frame indices (int64, ascending) of the given episode_index values, for held-out splits."""
        wanted = np.unique(np.fromiter(episodes, dtype=np.int64))
        positions = np.searchsorted(self._index.episode_index, wanted)
        known = (positions < len(self._index.episode_index)) & (
            self._index.episode_index[np.minimum(positions, len(self._index.episode_index) - 1)] == wanted
        )
        if not known.all():
            raise ConfigError(
                f"dataset {self.name} has no episode {', '.join(map(str, wanted[~known][:5].tolist()))}; "
                f"its episodes are {self._index.episode_index[0]}..{self._index.episode_index[-1]}"
            )
        starts, ends = self._index.episode_start[positions], self._index.episode_start[positions + 1]
        if len(starts) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in zip(starts, ends, strict=True)])

    def _check_frame(self, frame: int) -> int:
        frame = int(frame)
        if frame < 0:
            frame += len(self)
        if not 0 <= frame < len(self):
            raise IndexError(f"frame {frame} is out of range for {len(self)} frames")
        return frame

    def _episode_position(self, frame: int) -> int:
        return int(np.searchsorted(self._index.episode_start, frame, side="right")) - 1

    def _image(self, feature: str, frame: int, position: int) -> np.ndarray:
        if feature in self._index.video_files:
            return self._video_image(feature, frame, position)
        encoded = self._index.image(feature, frame)
        try:
            with Image.open(io.BytesIO(encoded)) as image:
                rgb = image if image.mode == "RGB" else image.convert("RGB")
                return np.array(rgb)
        except (UnidentifiedImageError, OSError) as error:
            episode_frame = frame - int(self._index.episode_start[position])
            raise DatasetError(
                self.name,
                f"episode {self._index.episode_index[position]}, frame {episode_frame}: {feature} "
                f"is not a readable image ({error})",
            ) from None

    def _video_image(self, feature: str, frame: int, position: int) -> np.ndarray:
        decoded = self._index.decoded.get(feature)
        try:
            if decoded is not None:
                return decoded.frame(frame)
            relative, time = self._index.video_frame(feature, frame)
            if self.root is None:
                raise DatasetError(self.name, f"{feature} is a video camera; the dataset's root is unknown")
            return self._video.frame(self.root / relative, time)
        except VideoError as error:
            episode_frame = frame - int(self._index.episode_start[position])
            raise DatasetError(
                self.name,
                f"episode {self._index.episode_index[position]}, frame {episode_frame}: camera {feature}: "
                f"{error}",
            ) from None


def open_dataset(
    name_or_path: str,
    *,
    cameras: Mapping[str, str] | None = None,
    action_horizon: int = ACTION_HORIZON,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    revision: str | None = None,
    normalization: NormalizationMethod = "quantile",
    camera_names: Literal["model", "dataset"] = "model",
    image_fit: ImageFit | None = None,
) -> LeRobotDataset:
    """Resolve, validate and index a dataset (once per content), then serve its frames as samples.
    `revision`: a Hub repo's branch, tag or commit (by default v2.1, else a v3.0 default branch).
    `normalization`: the model's (pi05: quantiles; SmolVLA: mean and std). `camera_names`: "model"
    maps the cameras to pi05's slots (`cameras`, else the features in order); "dataset" keeps every
    camera under the dataset's own feature name (SmolVLA reads any number of cameras). `image_fit`:
    how the model fits an image to its size (pi05's `relay_engine.models.image_fit`); video cameras
    are then decoded into the frame index at that size (None: at their recorded size), and their
    samples' images come fitted.

    Raises DatasetError naming the dataset and every problem found, ConfigError for a camera map or
    horizon that cannot be honoured.
    """
    if isinstance(action_horizon, bool) or not isinstance(action_horizon, int) or action_horizon < 1:
        raise ConfigError(f"action_horizon must be a positive integer, got {action_horizon!r}")
    source = locate_dataset(name_or_path, revision=revision, cache_dir=cache_dir, token=token)
    root = source.root
    meta = require_meta(root, name_or_path)
    index = FrameIndex(
        ensure_frame_index(meta, name_or_path, cache_dir_or_default(cache_dir), image_fit), image_fit
    )
    shipped = shipped_norm_stats(root, name_or_path, index.summary)
    norm_stats = replace(shipped[0] if shipped else index.norm_stats, method=normalization)
    camera_map = (
        map_cameras(name_or_path, index.summary, cameras)
        if camera_names == "model"
        else {feature: feature for feature in index.summary.cameras}
    )
    return LeRobotDataset(name_or_path, index, norm_stats, camera_map, action_horizon, source, root=root)


def map_cameras(name: str, summary: DatasetSummary, cameras: Mapping[str, str] | None) -> dict[str, str]:
    """Model camera -> dataset image feature: the given map, checked, or the features in order."""
    features = list(summary.cameras)
    if cameras is None:
        return dict(zip(MODEL_CAMERAS, features, strict=False))
    if not cameras:
        raise ConfigError(
            "cameras must map at least one model camera; valid model cameras: " + ", ".join(MODEL_CAMERAS)
        )
    for camera, feature in cameras.items():
        if camera not in MODEL_CAMERAS:
            raise ConfigError(
                f"cameras: unknown model camera {camera!r}; valid model cameras: " + ", ".join(MODEL_CAMERAS)
            )
        if feature not in summary.cameras:
            raise DatasetError(
                name,
                f"cameras: {camera} maps to {feature!r}, which is not an image feature of the dataset; "
                f"its image features: {', '.join(features)}",
            )
    return dict(cameras)


def shipped_norm_stats(root: Path, name: str, summary: DatasetSummary | None) -> tuple[NormStats, str] | None:
    """The dataset's own norm_stats.json (and its path in the dataset), checked against its widths."""
    for relative in SHIPPED_NORM_STATS:
        path = root / relative
        if not path.is_file():
            continue
        try:
            stats = NormStats.from_json(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise DatasetError(name, f"{relative}: {error}") from None
        if summary is not None:
            for field, stats_width, width in (
                ("state", stats.state_dim, summary.state_dim),
                ("actions", stats.action_dim, summary.action_dim),
            ):
                if stats_width != width:
                    raise DatasetError(
                        name,
                        f"{relative}: norm_stats.{field} is {stats_width} wide but the dataset's is {width}",
                    )
        return stats, relative
    return None


def dataset_norm_stats(
    name_or_path: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    revision: str | None = None,
) -> tuple[NormStats, str]:
    """The statistics training would use, and where they come from (the shipped file, or "computed").

    Unlike `open_dataset`, this builds no frame index: it reads only the numeric columns.
    """
    root = resolve_dataset(name_or_path, revision=revision, cache_dir=cache_dir, token=token)
    inspection = inspect_dataset(root, name_or_path)
    inspection.problems.raise_if_any()
    assert inspection.columns is not None
    shipped = shipped_norm_stats(root, name_or_path, inspection.summary)
    if shipped is not None:
        return shipped
    return compute_norm_stats(inspection.columns.state, inspection.columns.actions), "computed"
