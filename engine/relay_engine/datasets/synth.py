"""A synthetic LeRobot dataset (v2.1 or v3.0, images or video) whose correct actions can only be
learned by looking.

The task: a gripper (a white ring) moves on a plane towards a coloured target dot. Each episode
places one dot per task colour at random; the episode's task ("move to the red dot") says which
one is the target. Neither the target nor its colour is in the state, so a policy has to find the
dot in the image (and read the prompt when there are several tasks).

- state: the gripper's position (x, y) in [-1, 1]; wider states add fixed smooth functions of it.
- action: the step the gripper takes, `GAIN * (target - position)`; wider actions add fixed linear
  mixes of that same offset, so every action dimension needs the target too.
- cameras: the first camera sees the plane from `top_view` (centre and zoom; by default the
  whole plane); the others are "wrist" views centred on the gripper at `wrist_zoom`. The dot's
  radius is a fifth of the plane's width (0.4 in [-1, 1]), so it spans several patches once a
  policy resizes the image to a few dozen pixels (pi05-tiny's vision tower sees 32 px in 8 px
  patches and did not learn to find a dot half that size).
- variants: which colours are the tasks (`colours`), `distractors` (extra dots of colours no task
  names), camera placement (`top_view`, `wrist_zoom`) and the widths make a family of related
  tasks; the pi05-tiny base is pretrained on many of them (scripts/pretrain_tiny.py), and the
  demo fine-tunes it on one it never saw.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relay_engine.datasets.video import ENCODERS, VideoSettings, encoder_available
from relay_engine.datasets.writer import FORMATS, DatasetWriter, Episode
from relay_engine.errors import ConfigError

DEFAULT_CAMERAS: dict[str, tuple[int, int]] = {
    "observation.images.top": (64, 64),
    "observation.images.wrist": (64, 64),
}
# Fraction of the remaining offset covered per frame: about 95% of the way in 20 frames.
GAIN = 0.15
DOT_RADIUS = 0.4  # in plane units, the plane being [-1, 1]^2
RING_RADIUS = 0.16
WRIST_ZOOM = 2.0

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "blue": (40, 80, 235),
    "green": (40, 190, 60),
    "yellow": (235, 215, 40),
    "magenta": (220, 50, 210),
    "cyan": (40, 215, 225),
    "orange": (245, 140, 20),
    "black": (15, 15, 15),
}


def write_synthetic_dataset(
    out_dir: str | os.PathLike[str],
    *,
    episodes: int = 40,
    episode_length: int | tuple[int, int] = (30, 60),
    cameras: Mapping[str, tuple[int, int]] | None = None,
    state_dim: int = 2,
    action_dim: int = 2,
    num_tasks: int = 1,
    fps: int = 10,
    seed: int = 0,
    noise: int = 0,
    overwrite: bool = False,
    colours: Sequence[str] | None = None,
    distractors: int = 0,
    top_view: tuple[float, float, float] = (0.0, 0.0, 1.0),
    wrist_zoom: float = WRIST_ZOOM,
    format: str = "v2.1",
    video: bool | VideoSettings = False,
    video_codec: str = "h264",
    episodes_per_file: int = 1000,
) -> Path:
    """Write the dataset into `out_dir` (which must be empty or absent, unless `overwrite`); returns it.

    `episode_length` is a fixed length or an inclusive range (low, high) drawn per episode;
    `cameras` maps feature names (`observation.images.<name>`) to (height, width). `noise` adds
    uniform pixel noise of that amplitude, which makes the PNGs as large and as slow to decode as
    camera frames (the benchmarks use it; the default keeps the dataset small and quick to write).
    `colours` names the tasks' colours (default: the first `num_tasks` of COLOURS); `distractors`
    adds that many dots of other colours; `top_view` is the first camera's (centre x, centre y,
    zoom) and `wrist_zoom` the other cameras' zoom. `format` is "v2.1" or "v3.0"; `video` stores the
    cameras as mp4 (True: `video_codec`, h264 or av1, yuv420p; or the given VideoSettings);
    `episodes_per_file` is v3.0's episodes per data and video file.
    """
    cameras = dict(DEFAULT_CAMERAS if cameras is None else cameras)
    low, high = (episode_length, episode_length) if isinstance(episode_length, int) else episode_length
    colours = list(COLOURS)[:num_tasks] if colours is None else list(colours)
    _check_options(episodes, low, high, cameras, state_dim, action_dim, len(colours), fps, noise)
    _check_variant(colours, distractors, top_view, wrist_zoom)
    settings = _video_settings(format, video, video_codec)
    rng = np.random.default_rng(seed)
    scene = _Scene(
        lengths=(low, high),
        cameras=cameras,
        colours=colours,
        distractors=distractors,
        # Fixed per dataset, so the extra state and action dimensions are the same functions everywhere.
        state_mix=rng.normal(size=(state_dim - 2, 2)),
        action_mix=rng.normal(size=(action_dim - 2, 2)) * 0.5,
        noise=noise,
        top_view=top_view,
        wrist_zoom=wrist_zoom,
    )
    writer = DatasetWriter(
        out_dir,
        fps=fps,
        cameras=cameras,
        state_dim=state_dim,
        action_dim=action_dim,
        tasks=[f"move to the {colour} dot" for colour in colours],
        robot_type="relay-synthetic",
        overwrite=overwrite,
        format=format,
        video=settings,
        episodes_per_file=episodes_per_file,
    )
    try:
        for episode_index in range(episodes):
            writer.add_episode(scene.episode(rng, episode_index))
        return writer.finish()
    except BaseException:
        writer.abort()
        raise


@dataclass(frozen=True)
class _Scene:
    """What every episode of one dataset shares; `episode` draws the rest from the dataset's rng."""

    lengths: tuple[int, int]  # inclusive
    cameras: dict[str, tuple[int, int]]
    colours: list[str]  # the tasks' colours, task i's the i-th
    distractors: int
    state_mix: np.ndarray
    action_mix: np.ndarray
    noise: int
    top_view: tuple[float, float, float]
    wrist_zoom: float

    def episode(self, rng: np.random.Generator, episode_index: int) -> Episode:
        """One episode: its length, dots, start and background drawn, the gripper moving to the dot
        of its task (the tasks take turns), and every camera's frames."""
        low, high = self.lengths
        length = int(rng.integers(low, high + 1))
        task_index = episode_index % len(self.colours)
        others = [colour for colour in COLOURS if colour not in self.colours]
        shown = (
            self.colours + [str(c) for c in rng.permutation(others)[: self.distractors]]
            if self.distractors
            else self.colours
        )
        dots = _place_dots(rng, len(shown))
        start = rng.uniform(-0.8, 0.8, size=2)
        background = rng.integers(90, 170, size=3)
        positions, steps = _trajectory(start, dots[task_index], length)
        state = np.concatenate([positions, np.tanh(positions @ self.state_mix.T)], axis=1)
        actions = np.concatenate([steps, steps @ self.action_mix.T], axis=1)
        return Episode(
            task_index=task_index,
            state=state.astype(np.float32),
            actions=actions.astype(np.float32),
            images=self._images(rng, positions, dots, shown, background),
        )

    def _images(
        self,
        rng: np.random.Generator,
        positions: np.ndarray,
        dots: np.ndarray,
        shown: list[str],
        background: np.ndarray,
    ) -> dict[str, list[np.ndarray]]:
        """Each camera's frames, one per position: the first camera the top view, the others
        wrist views (the noise is drawn camera by camera, frame by frame)."""
        return {
            camera: [
                render(
                    size,
                    position,
                    dots,
                    shown,
                    background,
                    wrist=i > 0,
                    noise=self.noise,
                    rng=rng,
                    top_view=self.top_view,
                    wrist_zoom=self.wrist_zoom,
                )
                for position in positions
            ]
            for i, (camera, size) in enumerate(self.cameras.items())
        }


def _place_dots(rng: np.random.Generator, count: int) -> np.ndarray:
    """Dot centres (count, 2), kept apart so that no dot hides another (best effort for many tasks)."""
    dots = rng.uniform(-0.75, 0.75, size=(count, 2))
    for _ in range(200):
        gaps = np.linalg.norm(dots[:, None] - dots[None, :], axis=-1) + np.eye(count) * 9
        if gaps.min() >= 2.2 * DOT_RADIUS:
            break
        dots = rng.uniform(-0.75, 0.75, size=(count, 2))
    return dots


def _trajectory(start: np.ndarray, target: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions (length, 2) and the step taken from each, (length, 2)."""
    positions = np.empty((length, 2))
    steps = np.empty((length, 2))
    position = start.copy()
    for t in range(length):
        positions[t] = position
        steps[t] = GAIN * (target - position)
        position = position + steps[t]
    return positions, steps


def render(
    size: tuple[int, int],
    position: np.ndarray,
    dots: np.ndarray,
    colours: list[str],
    background: np.ndarray,
    *,
    wrist: bool,
    noise: int,
    rng: np.random.Generator,
    top_view: tuple[float, float, float] = (0.0, 0.0, 1.0),
    wrist_zoom: float = WRIST_ZOOM,
) -> np.ndarray:
    """One uint8 (H, W, 3) view of the plane: the dots, the gripper ring, and `noise`."""
    height, width = size
    if wrist:
        centre, zoom = position, wrist_zoom
    else:
        centre, zoom = np.asarray(top_view[:2], dtype=float), top_view[2]
    # Plane coordinates of each pixel centre; the shorter side spans the view.
    scale = 2.0 / (zoom * min(height, width))
    xs = (np.arange(width) + 0.5 - width / 2) * scale + centre[0]
    ys = (np.arange(height) + 0.5 - height / 2) * scale + centre[1]
    image = np.empty((height, width, 3), dtype=np.int16)
    image[:] = background
    for dot, colour in zip(dots, colours, strict=True):
        inside = (xs[None, :] - dot[0]) ** 2 + (ys[:, None] - dot[1]) ** 2 <= DOT_RADIUS**2
        image[inside] = COLOURS[colour]
    distance = np.sqrt((xs[None, :] - position[0]) ** 2 + (ys[:, None] - position[1]) ** 2)
    image[np.abs(distance - RING_RADIUS) <= max(0.04, 1.5 * scale)] = 255
    if noise:
        image += rng.integers(-noise, noise + 1, size=image.shape, dtype=np.int16)
    return np.clip(image, 0, 255).astype(np.uint8)


def _video_settings(format: str, video: bool | VideoSettings, codec: str) -> VideoSettings | None:
    if format not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if isinstance(video, VideoSettings):
        settings = video
    elif not video:
        return None
    elif codec not in ENCODERS:
        raise ConfigError(f"video codec must be one of {', '.join(ENCODERS)}, got {codec!r}")
    else:
        settings = VideoSettings(
            codec=codec, options=(("crf", "30"), ("preset", "12")) if codec == "av1" else (("crf", "23"),)
        )
    if not encoder_available(settings.encoder):
        raise ConfigError(
            f"this PyAV's FFmpeg has no {settings.encoder} encoder (for {settings.codec} video)"
        )
    return settings


def _check_variant(
    colours: list[str], distractors: int, top_view: tuple[float, float, float], wrist_zoom: float
) -> None:
    unknown = [colour for colour in colours if colour not in COLOURS]
    if unknown or len(set(colours)) != len(colours):
        raise ConfigError(
            f"colours must be distinct names from: {', '.join(COLOURS)}; got {', '.join(colours)}"
        )
    if not 0 <= distractors <= len(COLOURS) - len(colours):
        raise ConfigError(
            f"distractors must be 0 to {len(COLOURS) - len(colours)} (the colours no task names), "
            f"got {distractors}"
        )
    if len(top_view) != 3 or not 0.5 <= top_view[2] <= 4 or max(abs(top_view[0]), abs(top_view[1])) > 1:
        raise ConfigError(
            f"top_view must be (x, y, zoom) with |x|, |y| <= 1 and zoom 0.5 to 4, got {top_view}"
        )
    if not 0.5 <= wrist_zoom <= 4:
        raise ConfigError(f"wrist_zoom must be 0.5 to 4, got {wrist_zoom}")


def _check_options(
    episodes: int,
    low: int,
    high: int,
    cameras: dict[str, tuple[int, int]],
    state_dim: int,
    action_dim: int,
    num_tasks: int,
    fps: int,
    noise: int,
) -> None:
    if episodes < 1:
        raise ConfigError(f"episodes must be at least 1, got {episodes}")
    if not 1 <= low <= high:
        raise ConfigError(
            f"episode_length must be at least 1 (a range must be low <= high), got {low}-{high}"
        )
    if not cameras:
        raise ConfigError("cameras must name at least one camera")
    for camera, size in cameras.items():
        if len(size) != 2 or min(size) < 8:
            raise ConfigError(f"camera {camera}: size must be (height, width), each at least 8, got {size}")
    for name, width in (("state_dim", state_dim), ("action_dim", action_dim)):
        if not 2 <= width <= 32:
            raise ConfigError(f"{name} must be 2 to 32, got {width}")
    if not 1 <= num_tasks <= len(COLOURS):
        raise ConfigError(f"num_tasks must be 1 to {len(COLOURS)}, got {num_tasks}")
    if not 0 <= noise <= 64:
        raise ConfigError(f"noise must be 0 to 64, got {noise}")
    if fps < 1:
        raise ConfigError(f"fps must be at least 1, got {fps}")
